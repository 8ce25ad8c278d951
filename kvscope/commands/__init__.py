"""One module per ``kvscope`` subcommand; see :mod:`kvscope.cli`."""
