"""Cost models (the learned ranking model arrives with the learned search)."""
