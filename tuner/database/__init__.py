"""What tuning found: measure results (result), the JSONL record format and its queries (records)."""
