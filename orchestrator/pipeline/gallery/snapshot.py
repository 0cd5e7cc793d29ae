"""A ``ray_data`` gallery's snapshot in a pipeline: made once, recorded in the lineage, reused.

The first time a pipeline opens the gallery, Ray Data workers write the snapshot
(``orchestrator.distributed.ray_data_snapshot``) and the lineage commits step
``source:<gallery>`` with the snapshot's manifest (location and sha256) and files: ``verify``
checks them and ``gc`` leaves them alone. Every later open (a resumed run, the next generation)
reads the manifest and checks it against the lineage: plans address the gallery's items by row,
so the rows must be the ones the plans were made over.

- A snapshot without a manifest (a crash while it was written) is written again; one that the
  lineage recorded and that has gone is written again only if it comes out the same (its
  manifest's sha256; the same rows in the same files), else the run stops naming it.
- A read whose description changed (another table, other columns) after the gallery was first
  served is refused: its rows would not be the ones the shards hold.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.data.ray_data_read import RayDataSnapshotSource, read_manifest, read_spec, snapshot_folder
from orchestrator.integrity import IntegrityError
from orchestrator.lineage.step_keys import source_key
from orchestrator.storage import join_uri
from orchestrator.storage.hashing import sha256_hex


def open_snapshot(store, gallery: str, gallery_root: str, options: dict[str, Any], ensure_ray: Callable[[], None],
                  say: Callable[[str], None] = lambda line: None) -> RayDataSnapshotSource:
    """The gallery's source over its snapshot (module docstring), written first when there is none."""
    read = read_spec(options)
    folder = snapshot_folder(gallery_root, read)
    key = source_key(gallery)
    recorded = store.committed_outputs(key)
    if recorded is not None and recorded.get("digest") != read.digest:
        raise ValueError(f"gallery.options: the read changed since gallery {gallery!r} was first served (its snapshot "
                         f"{recorded.get('manifest_uri')} holds the rows its shards and plans address); serve the new "
                         "read as a gallery of another name")
    found, written = read_manifest(folder), None
    if found is None:
        from orchestrator.distributed.ray_data_snapshot import write_snapshot

        ensure_ray()
        written = write_snapshot(read, folder)
        say(f"{key}: read_{read.read} snapshot of {written['num_items']} items in {len(written['files'])} file(s) "
            f"written by Ray Data in {written['seconds']:.1f} s ({folder})")
        found = read_manifest(folder)
    manifest, data = found
    sha256 = sha256_hex(data)
    manifest_uri = join_uri(folder, "manifest.json")
    if recorded is not None and recorded.get("sha256") != sha256:
        raise IntegrityError(f"{manifest_uri}: the gallery's snapshot is not the one the lineage recorded (sha256 "
                             f"{sha256}, recorded {recorded.get('sha256')}): the read now gives other rows than the "
                             "shards and plans address")
    if recorded is None:
        store.commit_step(key, {"digest": read.digest, "manifest_uri": manifest_uri, "sha256": sha256,
                                "num_items": manifest["num_items"],
                                "files": [join_uri(folder, f["name"]) for f in manifest["files"]]})
    source = RayDataSnapshotSource(folder, manifest)
    source.written = written  # this open's write (seconds, rows the driver received), None when reused
    return source


def check_snapshot(outputs: dict[str, Any]) -> None:
    """IntegrityError unless the snapshot a ``source:`` step recorded is in place: its manifest
    (sha256) and every file it lists (size)."""
    import json

    from orchestrator.storage import read_bytes
    from orchestrator.storage.filesystem import open_filesystem

    data = read_bytes(outputs["manifest_uri"])
    if sha256_hex(data) != outputs["sha256"]:
        raise IntegrityError(f"{outputs['manifest_uri']}: snapshot manifest changed since it was written: sha256 "
                             f"{sha256_hex(data)}, the lineage holds {outputs['sha256']}")
    folder = outputs["manifest_uri"].rsplit("/", 1)[0]
    for entry in json.loads(data)["files"]:
        fs, path = open_filesystem(join_uri(folder, entry["name"]))
        if not fs.exists(path) or fs.size(path) != entry["bytes"]:
            raise IntegrityError(f"{join_uri(folder, entry['name'])}: snapshot file missing or of another size than "
                                 f"its manifest's {entry['bytes']} bytes")
