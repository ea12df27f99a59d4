"""The ClientApp: answers each round with its SuperNode's number."""

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Reply with this node's partition id (its node config) and the round."""
    round_no = int(msg.content["config"]["round"])
    value = float(context.node_config.get("partition-id", 1))
    metrics = MetricRecord({"value": value, "round": round_no})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
