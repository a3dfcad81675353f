"""Chess: RookWorld text formats, the Stockfish pool, and data generation."""
