from openroute.cli import build_parser


def test_cli_knows_its_commands() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).command == "demo"
    assert parser.parse_args(["run", "--port", "9000"]).port == 9000
    assert parser.parse_args(["db", "upgrade"]).db_command == "upgrade"
