from syncd.entry import main

raise SystemExit(main())
