from streamsched.ops.cli import main

raise SystemExit(main())
