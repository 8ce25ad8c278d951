from kvscope.cli import main

raise SystemExit(main())
