"""The SMQP gateway: sans-I/O protocol core (protocol, client_protocol, replies) and its asyncio edges."""
