"""Structured outputs over the WebSocket `submit`: a bad schema or regex is a clear
invalid_field error and the connection goes on; a good schema constrains the watched
request, whose sampling events show the masked distribution the sampler drew from."""
from __future__ import annotations

import json

from server_harness import Client

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}


def test_bad_schema_and_regex_are_clear_errors_and_the_connection_lives(server):
    c = Client(server.ws)
    try:
        for bad, says in (({"json": {"type": "no-such-type"}}, "json"), ({"regex": "a(b"}, "regex"),
                          ({"json": SCHEMA, "regex": "x"}, "exactly one")):
            reply = c.call("submit", prompt="Hello", params={"max_tokens": 4}, structured_outputs=bad)
            assert reply["type"] == "error" and reply["code"] == "invalid_field", reply
            assert reply["message"].startswith("structured_outputs:") and says in reply["message"], reply
        assert c.call("ping")["type"] != "error"   # still connected
        ack = c.ok("submit", prompt="Is it?", params={"temperature": 1.0, "seed": 3, "max_tokens": 24},
                   structured_outputs={"json": SCHEMA, "disable_any_whitespace": True},
                   watch={"layers": [], "sampling": True, "internals": True})
        rid = ack["request_id"]
        done = c.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, 60, since=0)
        assert json.loads(done["text"])["answer"] in ("yes", "no")
        vocab = server.engine.model_config.vocab_size
        tokens = c.events_of("request.token", rid)
        samples = {e["index"]: e for e in c.events_of("sampling", rid)}
        assert tokens and all(0 < t["allowed_tokens"] < vocab for t in tokens)
        assert len(samples) >= len(tokens) - 1   # a request's last step may end its watch first
        for t in (t for t in tokens if t["index"] in samples):
            s = samples[t["index"]]   # the sampling view is the masked row: only allowed tokens are candidates
            assert s["allowed_tokens"] == t["allowed_tokens"]
            assert len(s["distribution"]["ids"]) <= t["allowed_tokens"]
            assert t["token_id"] in s["distribution"]["ids"] or not s["distribution"]["complete"]
            applied = [stage for stage in s["stages"] if stage["applied"]]
            assert applied and applied[0]["name"] == "logits"   # a stage left off carries no numbers (v5)
            for stage in applied:
                assert stage["kept"] <= t["allowed_tokens"] and None not in stage["logits"]
            assert s["chosen"]["id"] == t["token_id"] and s["chosen"]["prob"] > 0
    finally:
        c.close()
