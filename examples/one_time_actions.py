"""One-time actions over HTTP: create, consume, cancel and read actions (magic links,
coupons, approvals), every refusal answered as ``application/problem+json``.

    pip install -e '.[dynamodb,fastapi]' uvicorn     (from a checkout)
    uvicorn one_time_actions:app     (from this repository: examples.one_time_actions:app)

Configured by the environment alone: the AWS SDK's own variables (credentials, AWS_REGION,
AWS_ENDPOINT_URL_DYNAMODB for a local DynamoDB) and IDEMPOTENCY_TABLE. The actions live in
the idempotency table, beside its records. tests/docs/test_actions_http.py runs this file under
uvicorn.
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, Field

from idempotency_middleware import (
    ActionError,
    ActionNotFoundError,
    AsyncDynamoDBStore,
    IdempotencyMiddleware,
    OneTimeActions,
)

store = AsyncDynamoDBStore(
    os.environ.get("IDEMPOTENCY_TABLE", "idempotency"),
    region_name=os.environ.get("AWS_REGION", "eu-west-1"),
)
one_time_actions = OneTimeActions(store)


def get_actions() -> OneTimeActions:
    """The actions service: a dependency, so a test can override it."""
    return one_time_actions


Actions = Annotated[OneTimeActions, Depends(get_actions)]


class NewAction(BaseModel):
    expires_in: float = Field(gt=0, le=30 * 86400)
    active_at: AwareDatetime | None = None
    pin: str | None = Field(default=None, min_length=4, max_length=12)
    max_pin_attempts: int = Field(default=5, ge=1, le=10)
    data: Any = None
    action_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._~-]{1,255}$")


class Consumption(BaseModel):
    pin: str | None = None
    reason: str | None = Field(default=None, max_length=200)


router = APIRouter(prefix="/actions", tags=["one-time actions"])


@router.post("", status_code=201)
async def create_action(new: NewAction, actions: Actions) -> dict[str, Any]:
    action = await actions.acreate(**new.model_dump())
    return action.to_dict()


@router.post("/{action_id}/consume")
async def consume_action(
    action_id: str, actions: Actions, consumption: Consumption | None = None
) -> dict[str, Any]:
    consumption = consumption or Consumption()
    action = await actions.aconsume(action_id, pin=consumption.pin, reason=consumption.reason)
    return action.to_dict()


@router.post("/{action_id}/cancel")
async def cancel_action(action_id: str, actions: Actions) -> dict[str, Any]:
    return (await actions.acancel(action_id)).to_dict()


@router.get("/{action_id}")
async def get_action(action_id: str, actions: Actions) -> dict[str, Any]:
    action = await actions.aget(action_id)
    if action is None:
        raise ActionNotFoundError("no such action", action_id=action_id)
    return action.to_dict()


async def action_problem(request: Request, error: Exception) -> JSONResponse:
    """Every refusal (404, 403, 409, 410, 423) as an RFC 9457 problem."""
    assert isinstance(error, ActionError)
    return JSONResponse(
        error.problem(), status_code=error.status, media_type="application/problem+json"
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with store:
        # Here so that the example runs as it is; in production, create the table at deploy
        # time (`idempotency-middleware create-table`) and drop this line.
        await store.create_table()
        yield


app = FastAPI(lifespan=lifespan)
app.include_router(router)
app.add_exception_handler(ActionError, action_problem)
# A client that retries a consume with the same Idempotency-Key (its first answer was lost)
# gets that answer replayed instead of 409 "already used".
app.add_middleware(IdempotencyMiddleware, store=store)
