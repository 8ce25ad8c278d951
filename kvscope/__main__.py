from kvscope.cli import main

if __name__ == "__main__":  # a spawned child process (export --follow's analyzer) imports this module too
    raise SystemExit(main())
