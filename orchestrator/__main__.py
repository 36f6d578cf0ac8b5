from orchestrator.fleet import main

main()
