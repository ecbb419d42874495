"""Sharded (FSDP2) training across trainer ranks; see issue 16."""
