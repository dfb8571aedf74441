"""Switch bisection of a change (docs/bisect.md): the search (search.py) and the stage (stage.py)."""
