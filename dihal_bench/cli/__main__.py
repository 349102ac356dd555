from dihal_bench.cli import main

main()
