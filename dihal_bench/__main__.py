from dihal_bench.console import main

main()
