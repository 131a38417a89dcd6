"""The command line's work: ``lstmcy check`` (``check``) and ``lstmcy demo`` (``demo``);
``python -m lstmcy`` parses the arguments (``lstmcy/__main__.py``)."""
