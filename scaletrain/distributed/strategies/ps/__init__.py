"""Parameter servers (--strategy ps): the strategy (workers), the server loop, the wire protocol
both speak, and how workers notice a dead one (membership)."""
