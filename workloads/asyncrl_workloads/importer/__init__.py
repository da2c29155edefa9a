"""``asyncrl import``: verl and AReaL configs translated into an AsyncRLJob (pure: dict in, dict out)."""
