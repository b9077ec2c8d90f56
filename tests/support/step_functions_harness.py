"""Step Functions workflows as the failure and crash tests run them: the example state
machines with a work branch the test drives, and status change events delivered the way AWS
delivers them.

- ``Workflows.machine()`` creates an example state machine (examples/*.asl.json, as a user
  copies it: only its table replaced) whose ``Work`` branch is ``work_branch``: count the run
  (the item ``runs#<job_id>``), wait at a gate (the item ``gate#<job_id>``, read every
  second) until the test opens it with an outcome, then fail with ``PaymentDeclined`` or
  return ``{"job_id": ..., "state": "shipped"}``. A state machine's DynamoDB tasks reach the
  table through ``dynamodb_tasks_on`` (tests/support/step_functions.py), which the tests hold.
- ``status_change_event()`` is the "Step Functions Execution Status Change" event AWS sends
  when an execution ends, in its documented shape, made from the execution as moto
  describes it (moto's Step Functions send none).
- ``EventBus`` is EventBridge on moto with the rule of the DynamoDB page's CloudFormation
  template, its target an SQS queue: ``deliver(event)`` puts the event on the bus and returns
  what the rule let through, as the Lambda function behind it receives it.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import yaml  # type: ignore[import-untyped]  # PyYAML, MkDocs' dependency

from idempotency_middleware.workflows.executions import execution_arn
from tests.conftest import REGION
from tests.support.step_functions import DEFINITION_FILE, ROLE_ARN, with_table

ROOT = Path(__file__).resolve().parents[2]
RULE_TEMPLATE = ROOT / "docs" / "snippets" / "stores-dynamodb-4.yaml"
WORK_ERROR = "PaymentDeclined"
WORK_CAUSE = "the card expired"
END_TIMEOUT_SECONDS = 30.0
_POLL_SECONDS = 0.05


def work_branch(table: str) -> dict[str, Any]:
    """The work a test's execution does, in place of the example's placeholder."""
    job = "$.job_id"

    def item(prefix: str) -> dict[str, Any]:
        return {"pk": {"S.$": f"States.Format('{prefix}#{{}}', {job})"}}

    return {
        "StartAt": "CountRun",
        "States": {
            "CountRun": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:updateItem",
                "Parameters": {
                    "TableName": table,
                    "Key": item("runs"),
                    "UpdateExpression": "ADD #runs :one",
                    "ExpressionAttributeNames": {"#runs": "runs"},
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                },
                "ResultPath": None,
                "Next": "Gate",
            },
            "Gate": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:getItem",
                "Parameters": {"TableName": table, "Key": item("gate"), "ConsistentRead": True},
                "ResultPath": "$.gate",
                "Next": "Open?",
            },
            "Open?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.gate.Item", "IsPresent": True, "Next": "Outcome?"}],
                "Default": "Pause",
            },
            "Pause": {"Type": "Wait", "Seconds": 1, "Next": "Gate"},
            "Outcome?": {
                "Type": "Choice",
                "Choices": [
                    {"Variable": "$.gate.Item.outcome.S", "StringEquals": "fail", "Next": "Fail"}
                ],
                "Default": "Ship",
            },
            "Fail": {"Type": "Fail", "Error": WORK_ERROR, "Cause": WORK_CAUSE},
            "Ship": {
                "Type": "Pass",
                "Parameters": {"job_id.$": job, "state": "shipped"},
                "End": True,
            },
        },
    }


def definition(table: str, file: Path = DEFINITION_FILE, timeout: int | None = None) -> str:
    """The example ``file`` on ``table``, doing ``work_branch``; with ``timeout``, the
    execution's ``TimeoutSeconds``. As JSON."""
    document = with_table(json.loads(file.read_text()), table)
    document["States"]["Work"]["Branches"] = [work_branch(table)]
    if timeout is not None:
        document["TimeoutSeconds"] = timeout
    return json.dumps(document)


class Workflows:
    """State machines on a moto Step Functions server, their work on ``table``."""

    def __init__(self, sfn_endpoint: str, dynamodb_endpoint: str, table: str) -> None:
        self.sfn_endpoint = sfn_endpoint
        self.table = table
        self.sfn: Any = boto3.client("stepfunctions", endpoint_url=sfn_endpoint, region_name=REGION)
        self.dynamodb: Any = boto3.client(
            "dynamodb", endpoint_url=dynamodb_endpoint, region_name=REGION
        )
        self.machines: list[str] = []

    def machine(self, file: Path = DEFINITION_FILE, *, timeout: int | None = None) -> str:
        """A new state machine of the example ``file``; its ARN."""
        arn: str = self.sfn.create_state_machine(
            name=f"jobs-{uuid.uuid4().hex[:12]}",
            definition=definition(self.table, file, timeout),
            roleArn=ROLE_ARN,
        )["stateMachineArn"]
        self.machines.append(arn)
        return arn

    def open_gate(self, job_id: str, outcome: str) -> None:
        """Let the job's executions go on past their gate: to ``"fail"`` or ``"ship"``."""
        item = {"pk": {"S": f"gate#{job_id}"}, "outcome": {"S": outcome}}
        self.dynamodb.put_item(TableName=self.table, Item=item)

    def close_gate(self, job_id: str) -> None:
        """Hold the job's next executions at their gate again."""
        self.dynamodb.delete_item(TableName=self.table, Key={"pk": {"S": f"gate#{job_id}"}})

    def arn_of(self, machine_arn: str, name: str) -> str:
        """The ARN of the state machine's execution ``name``."""
        return execution_arn(machine_arn, name)

    def runs(self, job_id: str) -> int:
        """How many executions started the job's work."""
        item = self.dynamodb.get_item(
            TableName=self.table, Key={"pk": {"S": f"runs#{job_id}"}}, ConsistentRead=True
        ).get("Item")
        # (moto's UpdateItem is not atomic: a read in the middle of the ADD that creates the
        # item can see it without its counter, seen at a load of 10; not counted yet.)
        return int(item["runs"]["N"]) if item and "runs" in item else 0

    def executions(self, machine_arn: str) -> list[str]:
        """The names of the state machine's executions, oldest first."""
        listed = self.sfn.list_executions(stateMachineArn=machine_arn)["executions"]
        return [execution["name"] for execution in sorted(listed, key=lambda e: e["startDate"])]

    def describe(self, execution_arn: str) -> dict[str, Any]:
        described: dict[str, Any] = self.sfn.describe_execution(executionArn=execution_arn)
        return described

    def wait_for_end(self, execution_arn: str) -> dict[str, Any]:
        """The execution, described once it left RUNNING."""
        deadline = time.monotonic() + END_TIMEOUT_SECONDS
        while (described := self.describe(execution_arn))["status"] == "RUNNING":
            assert time.monotonic() < deadline, f"{execution_arn} still running"
            time.sleep(_POLL_SECONDS)
        return described

    def wait_for_runs(self, job_id: str, runs: int) -> None:
        """Until ``runs`` executions started the job's work."""
        deadline = time.monotonic() + END_TIMEOUT_SECONDS
        while self.runs(job_id) < runs:
            assert time.monotonic() < deadline, f"{job_id}: fewer than {runs} runs"
            time.sleep(_POLL_SECONDS)

    def stop_running(self) -> None:
        """Stop what still runs: its next task would reach another test's table."""
        for machine in self.machines:
            for execution in self.sfn.list_executions(
                stateMachineArn=machine, statusFilter="RUNNING"
            )["executions"]:
                self.sfn.stop_execution(executionArn=execution["executionArn"])

    def close(self) -> None:
        try:
            self.stop_running()
        finally:
            self.sfn.close()
            self.dynamodb.close()


def _epoch_ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def status_change_event(workflows: Workflows, execution_arn: str) -> dict[str, Any]:
    """The event Step Functions sends EventBridge for the execution's status, in the shape
    AWS documents ("Step Functions Execution Status Change")."""
    described = workflows.describe(execution_arn)
    started = described["startDate"]
    detail = {
        "executionArn": described["executionArn"],
        "stateMachineArn": described["stateMachineArn"],
        "name": described["name"],
        "status": described["status"],
        "startDate": _epoch_ms(started),
        "stopDate": _epoch_ms(described.get("stopDate")),
        "input": described["input"],
        "inputDetails": {"included": True},
        "output": described.get("output"),
        "outputDetails": {"included": True} if "output" in described else None,
        "error": described.get("error"),
        "cause": described.get("cause"),
    }
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": "123456789012",
        "time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [described["executionArn"]],
        "detail": detail,
    }


def rule_pattern(state_machine_arn: str) -> dict[str, Any]:
    """The DynamoDB page's CloudFormation rule's event pattern, for ``state_machine_arn``."""
    template = yaml.safe_load(RULE_TEMPLATE.read_text())
    pattern: dict[str, Any] = template["ExecutionEndedRule"]["Properties"]["EventPattern"]
    assert pattern["detail"]["stateMachineArn"] == [{"Ref": "JobsStateMachine"}]
    pattern["detail"]["stateMachineArn"] = [state_machine_arn]
    return pattern


class EventBus:
    """EventBridge and SQS on moto: the rule sends what it matches to a queue."""

    def __init__(self, endpoint: str, state_machine_arn: str) -> None:
        self.events: Any = boto3.client("events", endpoint_url=endpoint, region_name=REGION)
        self.sqs: Any = boto3.client("sqs", endpoint_url=endpoint, region_name=REGION)
        name = f"execution-ended-{uuid.uuid4().hex[:12]}"
        self.queue = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self.rule = name
        self.events.put_rule(Name=name, EventPattern=json.dumps(rule_pattern(state_machine_arn)))
        self.events.put_targets(Rule=name, Targets=[{"Id": "release-keys", "Arn": queue_arn}])

    def deliver(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """Put ``event`` on the bus; the events the rule delivered (as JSON, decoded)."""
        answer = self.events.put_events(
            Entries=[
                {
                    "Source": event["source"],
                    "DetailType": event["detail-type"],
                    "Detail": json.dumps(event["detail"]),
                    "Resources": event["resources"],
                }
            ]
        )
        assert answer["FailedEntryCount"] == 0, answer
        received = self.sqs.receive_message(
            QueueUrl=self.queue, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        for message in received:
            self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=message["ReceiptHandle"])
        return [json.loads(message["Body"]) for message in received]

    def close(self) -> None:
        self.events.remove_targets(Rule=self.rule, Ids=["release-keys"])
        self.events.delete_rule(Name=self.rule)
        self.sqs.delete_queue(QueueUrl=self.queue)
        self.events.close()
        self.sqs.close()
