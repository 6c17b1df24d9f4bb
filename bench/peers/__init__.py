"""The peers, each driven through its fastest documented path."""
