"""Console entry points: tiny, parse config first, import heavy code after."""
