"""The Long-running work page's handler that starts a Step Functions execution, on moto
(127.0.0.1): two sends of one order start one execution, and the second gets the 202
replayed. (moto's Step Functions here run no state: only the start is shown.)"""

import json
import os

import boto3
from fastapi.testclient import TestClient
from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
# The store and the client find moto through the SDK's variables, never AWS.
os.environ.update(
    AWS_ENDPOINT_URL=f"http://{host}:{port}",
    AWS_ENDPOINT_URL_DYNAMODB=f"http://{host}:{port}",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_ACCESS_KEY_ID="local",
    AWS_SECRET_ACCESS_KEY="local",
)
os.environ["STATE_MACHINE_ARN"] = boto3.client("stepfunctions").create_state_machine(
    name="orders",
    definition=json.dumps({"StartAt": "Work", "States": {"Work": {"Type": "Pass", "End": True}}}),
    roleArn="arn:aws:iam::123456789012:role/orders",
)["stateMachineArn"]

# --8<-- [start:show]
import os
from typing import Any

import boto3
from fastapi import FastAPI

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware
from idempotency_middleware.step_functions import start_execution

STATE_MACHINE_ARN = os.environ["STATE_MACHINE_ARN"]
stepfunctions = boto3.client("stepfunctions")
store = AsyncDynamoDBStore("idempotency")
app = FastAPI()


@app.post("/orders", status_code=202)
def create_order(order: dict[str, Any]) -> dict[str, Any]:
    # The execution does the work; its last state stores the order's final response.
    execution = start_execution(stepfunctions, STATE_MACHINE_ARN, {"order": order})
    return {"status": "accepted", "execution": execution.name}


app.add_middleware(IdempotencyMiddleware, store=store)
# --8<-- [end:show]

with TestClient(app) as client:
    client.portal.call(store.acreate_table)  # (at deploy time in production)
    sends = [
        client.post("/orders", json={"sku": "A-1"}, headers={"Idempotency-Key": "order-7"})
        for _ in range(2)
    ]
    client.portal.call(store.aclose)
assert [send.status_code for send in sends] == [202, 202]
assert sends[1].headers["idempotent-replayed"] == "true"
assert sends[0].json() == sends[1].json()
executions = stepfunctions.list_executions(stateMachineArn=STATE_MACHINE_ARN)["executions"]
assert [execution["name"] for execution in executions] == [sends[0].json()["execution"]]
server.stop()
