"""A check the block-manager tests share: the pool's bookkeeping agrees with the tables."""
from __future__ import annotations


def check_invariants(bm, live: list) -> None:
    """Ref counts equal the number of live block tables holding each block; free means 0."""
    counts = [0] * bm.num_blocks
    for seq in live:
        for block_id in seq.block_table:
            counts[block_id] += 1
    for block in bm.blocks:
        assert block.ref_count == counts[block.block_id], f"block {block.block_id} ref mismatch"
        assert (block.ref_count == 0) == (block.block_id in bm.free_ids), f"block {block.block_id} free-list mismatch"
