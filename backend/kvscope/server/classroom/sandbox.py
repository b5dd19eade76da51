"""A page's own tiny `BlockManager`, poked by hand with made-up token ids, every token computed at once."""
from __future__ import annotations

import itertools

from kvscope.engine.block_manager import BlockManager
from kvscope.engine.sequence import Sequence
from kvscope.instrumentation.kv_state import block_dict, block_state
from kvscope.sampling_params import SamplingParams
from kvscope.server.errors import CommandError

MAX_SEQS = 32
PARAMS = SamplingParams(max_tokens=1)


def refuse(message: str) -> CommandError:
    return CommandError("sandbox", message)


class Sandbox:
    def __init__(self, num_blocks: int = 32, block_size: int = 4, max_model_len: int = 64):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
        self.max_model_len = max_model_len
        self.seqs: dict[str, Sequence] = {}
        self._tokens = itertools.count(1)
        self.last: dict | None = None

    def apply(self, cmd: dict) -> None:
        op = cmd["op"]
        if op == "reset":
            self.__init__(cmd.get("num_blocks", 32), cmd.get("block_size", 4), cmd.get("max_model_len", 64))
            self.last = {"op": "reset"}
        elif op == "allocate":
            self.allocate(self._name(cmd, "seq", new=True), self._need(cmd, "tokens"),
                          cmd.get("prefix_of"), cmd.get("prefix_tokens"))
        elif op == "append":
            self.append(self._name(cmd, "seq"), self._need(cmd, "tokens"))
        elif op == "fork":
            self.fork(self._name(cmd, "seq"), self._name(cmd, "new_seq", new=True))
        elif op == "free":
            self.free(self._name(cmd, "seq"))
        else:
            self.last = {"op": "state"}

    def allocate(self, name: str, n: int, prefix_of: str | None, prefix_tokens: int | None) -> None:
        tokens = []
        if prefix_of is not None:
            parent = self._get(prefix_of)
            k = min(parent.num_tokens if prefix_tokens is None else prefix_tokens, parent.num_tokens, n)
            tokens = parent.token_ids[:k]
        self._check_len(n)
        seq = Sequence(tokens + self._fresh(n - len(tokens)), PARAMS, request_id=name)
        hits = self.bm.match_prefix(seq)
        self._prefill(seq, hits)
        self.last = {"op": "allocate", "seq": name, "hits": len(hits),
                     "new_blocks": len(seq.block_table) - len(hits)}

    def append(self, name: str, n: int) -> None:
        seq = self._get(name)
        self._check_len(seq.num_tokens + n)
        if not self.bm.can_append(seq, n):
            needed = self.bm.blocks_for(seq.num_tokens + n) - len(seq.block_table)
            raise refuse(f"out of blocks: appending {n} tokens to {name} needs {needed} new block(s), "
                         f"{self.bm.num_free_blocks} free")
        before = len(seq.block_table)
        seq.token_ids.extend(self._fresh(n))
        self.bm.append_slots(seq, n)
        seq.num_computed_tokens += n
        self.bm.commit(seq)
        copied = len(self.bm.take_copies())   # no K/V here: a copy-on-write is only a new block
        self.last = {"op": "append", "seq": name, "new_blocks": len(seq.block_table) - before,
                     "copied_blocks": copied}

    def fork(self, name: str, new_name: str) -> None:
        """Share every block, the partly filled last one too: copied when one of them first appends (copy-on-write)."""
        parent = self._get(name)
        child = Sequence(list(parent.token_ids), PARAMS, request_id=new_name)
        self.bm.fork(parent, child)
        self.seqs[new_name] = child
        self.last = {"op": "fork", "seq": new_name, "shared_blocks": len(child.block_table)}

    def free(self, name: str) -> None:
        seq = self._get(name)
        freed = sum(1 for b in seq.block_table if self.bm.blocks[b].ref_count == 1)
        self.bm.free(seq)
        del self.seqs[name]
        self.last = {"op": "free", "seq": name, "freed_blocks": freed}

    def _prefill(self, seq: Sequence, hits: list[int]) -> None:
        if not self.bm.can_allocate(hits, seq.num_tokens):
            needed = self.bm.blocks_for(seq.num_tokens) - len(hits)
            raise refuse(f"out of blocks: {seq.request_id} needs {needed} new block(s), "
                         f"{self.bm.num_free_blocks} free")
        self.bm.allocate(seq, hits, seq.num_tokens - len(hits) * self.bm.block_size)
        seq.num_computed_tokens = seq.num_tokens
        self.bm.commit(seq)
        self.seqs[seq.request_id] = seq

    def _fresh(self, n: int) -> list[int]:
        return [next(self._tokens) for _ in range(n)]

    def _check_len(self, n: int) -> None:
        if n > self.max_model_len:
            raise refuse(f"a sequence may hold at most max_model_len = {self.max_model_len} tokens; this needs {n}")

    def _get(self, name: str) -> Sequence:
        if name not in self.seqs:
            raise refuse(f"no sandbox sequence named {name!r}; have {sorted(self.seqs) or 'none'}")
        return self.seqs[name]

    def _name(self, cmd: dict, key: str, new: bool = False) -> str:
        name = self._need(cmd, key)
        if new and name in self.seqs:
            raise refuse(f"a sandbox sequence named {name!r} exists already")
        if new and len(self.seqs) >= MAX_SEQS:
            raise refuse(f"the sandbox holds at most {MAX_SEQS} sequences")
        return name

    @staticmethod
    def _need(cmd: dict, key: str):
        if cmd.get(key) is None:
            raise CommandError("invalid_field", f"{key}: required for sandbox op {cmd['op']!r}")
        return cmd[key]

    def state(self) -> dict:
        bm, bs = self.bm, self.bm.block_size
        owners: dict[int, dict[str, int]] = {}
        for name, seq in self.seqs.items():
            for i, b in enumerate(seq.block_table):
                owners.setdefault(b, {})[name] = i
        states = [block_state(blk.ref_count, blk.hash, owners.get(blk.block_id, {}), self.seqs, bs) for blk in bm.blocks]
        used = [s for s in states if s[0] > 0]
        reserved = len(used) * bs
        used_slots = sum(s.num_tokens for s in self.seqs.values())
        logical = sum(len(s.block_table) for s in self.seqs.values()) * bs
        waste = sum(bs - s[1] for s in used)
        contiguous = len(self.seqs) * self.max_model_len
        return {
            "type": "sandbox", "block_size": bs, "num_blocks": bm.num_blocks, "max_model_len": self.max_model_len,
            "blocks": [block_dict(b, s) for b, s in enumerate(states)],
            "seqs": [{"name": n, "num_tokens": s.num_tokens, "block_table": list(s.block_table),
                      "cached_tokens": s.num_cached_tokens} for n, s in self.seqs.items()],
            "num_free": bm.num_free_blocks, "num_cached": sum(1 for s in states if s[0] == 0 and s[2]),
            "last": self.last,
            "fragmentation": {
                "paged": {"reserved_slots": reserved, "used_slots": used_slots,
                          "shared_slots_saved": logical - reserved, "internal_waste_slots": waste,
                          "waste_fraction": round(waste / reserved, 4) if reserved else 0.0},
                "contiguous": {"reserved_slots": contiguous, "used_slots": used_slots,
                               "waste_slots": contiguous - used_slots,
                               "waste_fraction": round((contiguous - used_slots) / contiguous, 4) if contiguous else 0.0}},
        }
