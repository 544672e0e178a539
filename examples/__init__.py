"""Runnable examples of integrating streamsched (not installed; run them from the checkout)."""
