"""`python -m repro.shards pack SRC DEST [--shard-size 256MB] [--seed 0] [--pixels]` packs an image
folder or CIFAR-10 into shards; `python -m repro.shards verify ROOT` checks every shard's SHA-256
against the manifest (ROOT a folder, or s3://bucket/prefix through the cache)."""

from __future__ import annotations

import argparse

from repro.core.errors import UserError, exit_with
from repro.shards.format import parse_manifest
from repro.shards.pack import pack, parse_size
from repro.shards.store import open_store


def verify(url: str, endpoint_url: str | None, cache_dir: str | None) -> int:
    """Check every shard whole; the count of shards checked."""
    from repro.shards.format import check_members, sha256_of
    from repro.shards.store import open_shard

    store = open_store(url, cache_dir, 1e6, endpoint_url)  # verifying keeps what it fetched
    manifest = parse_manifest(store.manifest(), f"{url}/manifest.json")
    checked = 0
    for shards in manifest.splits.values():
        for shard in shards:
            with open_shard(store, shard) as handle:
                digest = sha256_of(handle)
                if digest == shard.sha256:  # whole: now its members, as a reader finds them
                    handle.seek(0)
                    check_members(handle, shard, f"{url}/{shard.name}")
            if digest != shard.sha256:
                raise UserError(f"shard {url}/{shard.name}: its SHA-256 is not the manifest's")
            checked += 1
    return checked


def main(argv: list[str]) -> None:
    """The command line's two commands; a user's mistake is one line and exit status 2."""
    parser = argparse.ArgumentParser(prog="python -m repro.shards", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="pack an image folder or CIFAR-10 into shards")
    packing.add_argument("src", help="an image folder (train/<class>/...) or CIFAR-10's folder")
    packing.add_argument("dest", help="the new folder of shards (must not exist)")
    packing.add_argument("--shard-size", default="256MB", help="bytes per shard (256MB)")
    packing.add_argument("--seed", type=int, default=0, help="the packing shuffle's seed")
    pixels_help = "store decoded pixels (.npy), not the image files' bytes"
    packing.add_argument("--pixels", action="store_true", help=pixels_help)
    checking = commands.add_parser("verify", help="check every shard against the manifest")
    checking.add_argument("root", help="a folder of shards or s3://bucket/prefix")
    checking.add_argument("--endpoint-url", default=None, help="an S3-compatible endpoint")
    checking.add_argument("--cache-dir", default=None, help="where s3 shards are cached")
    args = parser.parse_args(argv)
    from pathlib import Path

    try:
        if args.command == "pack":
            size = parse_size(args.shard_size)
            src, dest = Path(args.src).expanduser(), Path(args.dest).expanduser()
            manifest = pack(src, dest, size, args.seed, args.pixels)
            print(f"packed {args.src} into {manifest.parent} ({manifest.name} lists the shards)")
        else:
            count = verify(args.root, args.endpoint_url, args.cache_dir)
            print(f"{args.root}: {count} shards match the manifest")
    except UserError as error:
        exit_with(error)
