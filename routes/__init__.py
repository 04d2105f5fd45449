"""The reference application's routes, written in the openroute DSL; ``openroute run`` serves them."""
