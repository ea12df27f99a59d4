"""The ServerApp: waits for min-nodes SuperNodes, then runs num-rounds rounds."""

import json
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Sum every node's answer each round; raise when the run config says `fail`."""
    config = context.run_config
    if bool(config["fail"]):
        raise RuntimeError("tinyfl: failing as its run config asks")
    for key, expected in (
        ("fl-dispatcher-required-sites", config["expect-sites"]),
        ("fl-dispatcher-resource-spec", config["expect-resource-spec"]),
    ):
        if expected and json.loads(str(config[key])) != json.loads(str(expected)):
            raise RuntimeError(f"tinyfl: {key} is {config[key]!r}, not {expected!r}")
    min_nodes = int(config["min-nodes"])
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < min_nodes:
        time.sleep(0.2)
        node_ids = list(grid.get_node_ids())
    for round_no in range(1, int(config["num-rounds"]) + 1):
        messages = [
            Message(
                RecordDict({"config": ConfigRecord({"round": round_no})}),
                dst_node_id=node_id,
                message_type="train",
            )
            for node_id in node_ids
        ]
        replies = list(grid.send_and_receive(messages, timeout=60))
        total = sum(float(r.content["metrics"]["value"]) for r in replies if r.has_content())
        print(f"tinyfl round {round_no}: {len(replies)} replies, sum {total}")
        time.sleep(float(config["round-sleep-s"]))
