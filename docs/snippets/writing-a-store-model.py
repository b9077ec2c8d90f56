from idempotency_middleware import MemoryStore
from idempotency_middleware.stores.model import check_store_against_model

# One store per sequence, on the clock the check moves; no purge of expired records while a
# sequence runs (the model keeps them until a claim replaces them).
explored = check_store_against_model(
    lambda clock: MemoryStore(
        max_response_bytes=64, purge_interval_seconds=float("inf"), clock=clock
    ),
    flavour="sync",  # "async": the a-prefixed methods, on an event loop
    max_response_bytes=64,  # the largest body the store keeps
    max_examples=20,
    steps=25,
)
print(f"{explored.sequences} sequences, {explored.steps} steps: the store answers as the model")
