resource "aws_cloudwatch_event_rule" "execution_ended" {
  name        = "idempotency-execution-ended"
  description = "Release the idempotency key of an execution that failed, timed out or was aborted"
  event_pattern = jsonencode({
    source        = ["aws.states"]
    "detail-type" = ["Step Functions Execution Status Change"]
    detail = {
      status          = ["FAILED", "TIMED_OUT", "ABORTED"]
      stateMachineArn = [aws_sfn_state_machine.jobs.arn]
    }
  })
}

resource "aws_cloudwatch_event_target" "release_keys" {
  rule = aws_cloudwatch_event_rule.execution_ended.name
  arn  = aws_lambda_function.release_keys.arn
}

resource "aws_lambda_permission" "execution_ended" {
  statement_id  = "AllowExecutionEndedRule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.release_keys.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.execution_ended.arn
}
