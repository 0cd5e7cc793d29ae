"""Galleries, their shards (which generation's embeddings and index each holds) and the backfills
that move a shard from one generation to another."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.lineage.locations import StoreLocations
from orchestrator.lineage.records import BackfillRecord, GalleryRecord, ShardAssignment, ShardRecord
from orchestrator.lineage.rows import (
    assign,
    backfill_record,
    find_gallery,
    find_generation,
    gallery_record,
    generation_names,
    shard_record,
)
from orchestrator.lineage.schema import Backfill, Gallery, Shard, utcnow
from orchestrator.lineage.steps import commit_step_in


def find_shard(session: Session, gallery: Gallery, index: int) -> Shard:
    """Shard ``index`` of ``gallery`` (locked for update), created empty if missing; ValueError outside the
    gallery's shard range."""
    if not 0 <= index < gallery.n_shards:
        raise ValueError(f"gallery {gallery.name!r} has shards 0..{gallery.n_shards - 1}, not {index}")
    row = session.scalars(
        select(Shard).where(Shard.gallery_id == gallery.id, Shard.index == index).with_for_update()
    ).one_or_none()
    if row is None:
        row = Shard(gallery_id=gallery.id, index=index, updated_at=utcnow())
        session.add(row)
        session.flush()
    return row


def assign_in(session: Session, gallery_row: Gallery, assignment: ShardAssignment) -> ShardRecord:
    """Point one shard at an assignment's generation inside ``session``, recording (or completing) the
    backfill when the generation changes."""
    gen = find_generation(session, assignment.generation)
    shard = find_shard(session, gallery_row, assignment.index)
    now = utcnow()
    if shard.generation_id != gen.id:
        source_id = (shard.generation_id if assignment.backfilled_from is None
                     else find_generation(session, assignment.backfilled_from).id)
        open_backfill = session.scalars(
            select(Backfill).where(Backfill.shard_id == shard.id, Backfill.to_generation_id == gen.id,
                                   Backfill.status == "started").order_by(Backfill.id.desc()).with_for_update()
        ).first()
        if open_backfill is None:
            session.add(Backfill(shard_id=shard.id, from_generation_id=source_id, to_generation_id=gen.id,
                                 items=assignment.n_items, status="committed", started_at=now, finished_at=now))
        else:
            open_backfill.from_generation_id = source_id
            open_backfill.items = assignment.n_items if assignment.n_items is not None else open_backfill.items
            open_backfill.status = "committed"
            open_backfill.finished_at = now
    if assign(shard, generation_id=gen.id, embeddings_uri=assignment.embeddings_uri,
               index_uri=assignment.index_uri, sha256=assignment.sha256, n_items=assignment.n_items):
        shard.updated_at = now
    session.flush()
    return shard_record(shard, gallery_row.name, generation_names(session))


class GalleriesMixin(StoreLocations):
    """Galleries, shards and backfills."""

    def upsert_gallery(self, name: str, source_uri: Optional[str] = None, n_items: Optional[int] = None,
                       n_shards: int = 1) -> GalleryRecord:
        """Create or update gallery ``name``, and one (empty) shard row per index < ``n_shards``
        so every shard shows up before it holds embeddings. Lowering ``n_shards`` below an
        existing shard index raises ValueError (re-shard under a new gallery name)."""
        if n_shards < 1:
            raise ValueError(f"gallery {name!r}: n_shards must be ≥ 1, got {n_shards}")
        source_uri = self._stored(source_uri)

        def fn(session: Session) -> GalleryRecord:
            row = session.scalars(select(Gallery).where(Gallery.name == name).with_for_update()).one_or_none()
            if row is None:
                row = Gallery(name=name, source_uri=source_uri, n_items=n_items, n_shards=n_shards, created_at=utcnow())
                session.add(row)
                session.flush()
                present: set[int] = set()
            else:
                present = set(session.scalars(select(Shard.index).where(Shard.gallery_id == row.id)))
                if present and max(present) >= n_shards:
                    raise ValueError(f"gallery {name!r} already has shard {max(present)}; cannot shrink to {n_shards} shards")
                assign(row, source_uri=source_uri, n_items=n_items, n_shards=n_shards)
            now = utcnow()
            for index in range(n_shards):
                if index not in present:
                    session.add(Shard(gallery_id=row.id, index=index, updated_at=now))
            session.flush()
            return gallery_record(row)
        return self._write(fn)

    def galleries(self) -> list[GalleryRecord]:
        return self._read(lambda s: [gallery_record(g) for g in s.scalars(select(Gallery).order_by(Gallery.id))])

    def get_gallery(self, name: str) -> GalleryRecord:
        return self._read(lambda s: gallery_record(find_gallery(s, name)))

    def assign_shard(
        self,
        gallery: str,
        index: int,
        generation: str,
        embeddings_uri: Optional[str] = None,
        index_uri: Optional[str] = None,
        sha256: Optional[str] = None,
        n_items: Optional[int] = None,
        *,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
        with_steps: Optional[Mapping[str, Mapping[str, Any]]] = None,
    ) -> ShardRecord:
        """Point shard ``index`` of ``gallery`` at ``generation``'s embeddings and index (files
        already written). In the same transaction: if the shard changes generation, a
        ``committed`` backfill row from → to (completing one opened by ``start_backfill``);
        with ``step``, the step's commit; with ``with_steps`` (key → outputs), those steps'
        commits too (the integrity records of the index files the shard points at:
        ``integrity.index_steps``). Re-assigning the generation a shard already holds
        only updates its URIs/sha256/size — no backfill row, so a re-run adds nothing."""
        assignment = ShardAssignment(index, generation, embeddings_uri, index_uri, sha256, n_items)
        outputs = step_outputs if step_outputs is not None else {
            "gallery": gallery, "shard": index, "generation": generation,
            "embeddings_uri": embeddings_uri, "index_uri": index_uri, "sha256": sha256,
        }
        return self.assign_shards(gallery, [assignment], step=step, step_outputs=outputs, with_steps=with_steps)[0]

    def assign_shards(
        self,
        gallery: str,
        assignments: Iterable[ShardAssignment],
        *,
        grow: bool = False,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
        with_steps: Optional[Mapping[str, Mapping[str, Any]]] = None,
    ) -> list[ShardRecord]:
        """Apply several shard assignments of ``gallery`` in ONE transaction (see ``assign_shard``
        for one): e.g. moving backfilled items out of a shard into a new one, so no reader ever
        sees the items in both shards or in neither. With ``grow``, a shard index at or beyond the
        gallery's shard count adds that shard (the gallery grows); without, it is an error. With
        ``step`` (and ``with_steps``, key → outputs), those steps commit in the same transaction."""
        assignments = [self._stored_assignment(a) for a in assignments]
        keys = None if step is None else self._key_forms(step)
        outputs = self._stored(step_outputs if step_outputs is not None else {
            "gallery": gallery, "shards": [a.index for a in assignments]})
        others = [(self._key_forms(key), self._stored(dict(other))) for key, other in (with_steps or {}).items()]
        if not assignments:
            raise ValueError(f"gallery {gallery!r}: no shard assignments given")
        if len({a.index for a in assignments}) != len(assignments):
            raise ValueError(f"gallery {gallery!r}: a shard index appears twice in one assignment")

        def fn(session: Session) -> list[ShardRecord]:
            gallery_row = find_gallery(session, gallery)
            highest = max(a.index for a in assignments)
            if grow and highest >= gallery_row.n_shards:
                gallery_row.n_shards = highest + 1
            records = [assign_in(session, gallery_row, a) for a in assignments]
            for other_keys, other_outputs in others:
                commit_step_in(session, other_keys, other_outputs)
            if keys is not None:
                commit_step_in(session, keys, outputs)
            session.flush()
            return records
        return self._write(fn)

    def start_backfill(self, gallery: str, index: int, generation: str, items: Optional[int] = None) -> Optional[BackfillRecord]:
        """Open a ``started`` backfill of a shard towards ``generation`` (for progress/audit;
        ``assign_shard`` commits it). Idempotent: an open one is returned as is. None when the
        shard already holds ``generation`` (nothing to backfill)."""
        def fn(session: Session) -> Optional[BackfillRecord]:
            gallery_row = find_gallery(session, gallery)
            gen = find_generation(session, generation)
            shard = find_shard(session, gallery_row, index)
            if shard.generation_id == gen.id:
                return None
            row = session.scalars(
                select(Backfill).where(Backfill.shard_id == shard.id, Backfill.to_generation_id == gen.id,
                                       Backfill.status == "started").order_by(Backfill.id.desc())
            ).first()
            if row is None:
                row = Backfill(shard_id=shard.id, from_generation_id=shard.generation_id, to_generation_id=gen.id,
                               items=items, status="started", started_at=utcnow())
                session.add(row)
                session.flush()
            return backfill_record(row, gallery_row.name, shard.index, generation_names(session))
        return self._write(fn)

    def fail_backfill(self, gallery: str, index: int, generation: str) -> Optional[BackfillRecord]:
        """Mark the open backfill of a shard towards ``generation`` failed (None if none is open);
        the shard keeps its current generation."""
        def fn(session: Session) -> Optional[BackfillRecord]:
            gallery_row = find_gallery(session, gallery)
            gen = find_generation(session, generation)
            shard = find_shard(session, gallery_row, index)
            row = session.scalars(
                select(Backfill).where(Backfill.shard_id == shard.id, Backfill.to_generation_id == gen.id,
                                       Backfill.status == "started").order_by(Backfill.id.desc()).with_for_update()
            ).first()
            if row is None:
                return None
            row.status, row.finished_at = "failed", utcnow()
            session.flush()
            return backfill_record(row, gallery_row.name, shard.index, generation_names(session))
        return self._write(fn)

    def backfills(self, gallery: Optional[str] = None) -> list[BackfillRecord]:
        """Backfill history (oldest first), of one gallery or all."""
        def fn(session: Session) -> list[BackfillRecord]:
            stmt = (select(Backfill, Gallery.name, Shard.index).join(Shard, Backfill.shard_id == Shard.id)
                    .join(Gallery, Shard.gallery_id == Gallery.id).order_by(Backfill.id))
            if gallery is not None:
                stmt = stmt.where(Gallery.id == find_gallery(session, gallery).id)
            names = generation_names(session)
            return [backfill_record(b, g, i, names) for b, g, i in session.execute(stmt)]
        return self._read(fn)

    def shards(self, gallery: str) -> list[ShardRecord]:
        """The shards of ``gallery`` by index, each with the generation it holds (None: empty)."""
        def fn(session: Session) -> list[ShardRecord]:
            gallery_row = find_gallery(session, gallery)
            names = generation_names(session)
            rows = session.scalars(select(Shard).where(Shard.gallery_id == gallery_row.id).order_by(Shard.index))
            return [shard_record(r, gallery_row.name, names) for r in rows]
        return self._read(fn)
