"""Credentials and access: token generation and hashing, the user access policy."""
