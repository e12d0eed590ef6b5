import typer

app = typer.Typer(
    name="seqpack",
    help="Sequence packing for LLM/VLM SFT: pack chat data, inspect packed datasets, validate configs.",
    no_args_is_help=True,
    add_completion=False,
)
