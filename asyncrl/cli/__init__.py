"""The ``asyncrl`` command line: ``main`` plus one module per subcommand, each imported only when invoked."""
