"""Subscriptions: durable deliveries from a source stream to a copy, a
function call, a stream processor or a signed webhook."""
