from seqpack.cli import main

main()
