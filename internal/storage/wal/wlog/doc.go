// Package wlog is the segmented log of the embedded engine: an ordered sequence of records
// numbered by a dense int64 index, stored in preallocated segment files in one directory, made
// durable by group commit.
//
// # Usage
//
//	c := wlog.NewCommitter(wlog.CommitterOptions{})   // one per engine: shares fsyncs
//	defer c.Close()
//	l, err := wlog.Open(dir, wlog.Options{})          // recovers a torn tail
//	defer l.Close()                                   // after the last append completed
//	first, err := c.Append(ctx, l, []wlog.Record{{Timestamp: now, Body: b}})
//	recs, err := l.Read(first, 100, 1<<20)
//
// Each record carries a timestamp chosen by the caller (unix ns), kept in its frame, and a body the
// log does not interpret (the engine's bodies are in package record).
//
// # Files
//
// A log directory holds:
//
//	00000000000000000000.seg   segment: records from index 0
//	00000000000000000000.idx   sidecar index of that segment (written when it is sealed)
//	00000000000000001234.seg   the active segment: records from index 1234
//
// Segment files are named by the index of their first record (base index), 20 digits zero-padded,
// so that names sort like indexes. Every segment but the last is sealed: it is never written again.
// Files ending in ".tmp" are in the making and removed by Open.
//
// # Segment format
//
// All integers are little-endian. A segment starts with a 32-byte header:
//
//	 0      4         8              16              24         28       32
//	+------+---------+--------------+---------------+----------+--------+
//	| SPLW | version |  base index  | created (ns)  | reserved | crc32c |
//	+------+---------+--------------+---------------+----------+--------+
//	  magic   u32=1       i64             i64          u32=0     of bytes 0..28
//
// Frames follow, each starting at an offset that is a multiple of 8 (FrameAlign):
//
//	 0         4         8              16
//	+---------+---------+--------------+----------------------+-----------+
//	| length  | crc32c  |  timestamp   | body (length-8 bytes) | 0 padding |
//	+---------+---------+--------------+----------------------+-----------+
//	   u32       u32          i64                               to 8 bytes
//
// length is 8 + len(body): the bytes after the crc word. It is never 0, so a zero length word
// marks the end of the records. crc32c is CRC-32C (Castagnoli) over the length word, then the
// timestamp and the body (everything but itself and the padding), so a damaged length never
// passes for another record. The 8-byte alignment lets recovery step 8 bytes at a time looking
// for a frame that verifies. A body is at most Options.MaxRecordBytes; a length above that is
// damage, and never makes a reader allocate more.
//
// After the last frame the segment holds zeros up to its preallocated size, which is its own: a
// new log's first segment is Options.FirstSegmentBytes (64 KiB by default), and each next one the
// smallest FirstSegmentBytes x 4^k of at least twice what the one before used, at most
// Options.SegmentBytes (64 MiB by default). A record that does not fit in the rest of the active segment goes into a
// new one (a record larger than a whole segment gets a segment of its own, which grows past the
// preallocated size).
//
// # Sidecar index
//
// When a segment is sealed, an index file records where its frames are, so Open does not read the
// segment:
//
//	 0      4         8       16      24         32         40         48
//	+------+---------+-------+-------+----------+----------+----------+------------------+--------+
//	| SPLI | version | base  | count | min time | max time | data end | count x u32 pos  | crc32c |
//	+------+---------+-------+-------+----------+----------+----------+------------------+--------+
//
// pos are the frame offsets, data end is the end of the last frame (padding included), crc32c
// covers everything before it. The index is derived data: it is written (temp file, rename)
// without fsync, and Open rebuilds it by scanning the segment when it is missing or does not
// check out (checksum, base, count, last frame). A clean Close also writes the index of the active
// segment, so that the next Open scans nothing; it is removed (and the removal made durable)
// before the next append to that segment.
//
// # Memory
//
// A log keeps 4 bytes per record in memory (the frame offsets of each segment), so Read is O(1)
// and 1,000,000 records cost about 4 MB. Bodies stay on disk and are read with pread, no mmap.
//
// # Durability
//
// The committer writes a round of appends into the page cache, makes each log durable, then
// publishes each log's records (NextIndex advances) and completes its waiters as soon as that
// log is durable: readers never see a record that is not durable. A log syncs with fdatasync (in
// parallel when a round carries several logs), or rides on another log's cache flush when that is
// safe (Committer.shareFlush: same device of an ext4 filesystem that does not journal data,
// FlushSharer, and a round that writes only into blocks whose metadata an fdatasync already made
// durable; Options.NoSharedFlush turns it off): it is written back with sync_file_range (its
// write-back and the anchor's are started together) and completes once the anchor's fdatasync
// returned (two concurrent fdatasyncs take ~1.8 times as long as one). New segment files
// are made in place as ".tmp" (preallocated, header written, fdatasync), then renamed, and the
// directory is fsynced; deletions are followed by a directory fsync too. DeleteBefore renames a
// segment to ".tmp" (made durable, so that a crash never leaves a shortened segment under its
// name) and frees it 4 MiB at a time by truncating it from its end, pausing after each step as
// long as it took: on a file system mounted with online discard, unlinking 64 MiB at once sends
// one large discard, and a standalone fdatasync loop on the development VM waited 8-15 ms behind
// each such unlink; freed in steps, under ~2-4 ms. A failed write or sync is sticky: every later
// append to the log fails with it, wrapped in ErrFailed (which says that nothing of that append
// was written, unlike the appends of the round that failed), and the sync is never retried (after
// a failed fsync the page cache cannot be trusted).
//
// Segments are preallocated (fallocate) and zero-filled before records go into them, so that
// the records go into blocks already written: on ext4 the first write into a fallocated
// (unwritten) extent changes metadata, and fdatasync then commits the journal too. Measured on the
// development VM (virtio disk, ext4), fdatasync after each 4 KiB write ran at ~7,000/s into a
// fallocated file and ~10,500/s into a zero-filled one (16 KiB: ~6,900/s and ~10,000/s; appending
// to a growing file ~5,000-6,600/s). A background goroutine prepares the next segment (the spare)
// once the active one is half full, like etcd's file pipeline: fallocate and fdatasync, then zeros
// 256 KiB at a time, each chunk written back (sync_file_range, no cache flush) before the next and
// followed by a pause as long as it took, one spare at a time in the process, so that the disk
// carries it next to the committer's syncs. A roll that comes first stops it between chunks; the
// committer zero-fills what is left (and the first segment of a log) 1 MiB ahead of the records
// (zeroAhead). Two earlier designs stalled the commit path: zero-filling a spare whole and
// syncing it at once made the committer's syncs take 22-29 ms for ~100 ms at every roll (at 10
// MB/s, every 6.4 s: the end-to-end p99.9 doubled); zeroing only in the rounds made one round per
// MiB take ~850 us instead of ~185.
//
// # Recovery
//
// Open loads each sealed segment's index (or scans it: then it must hold exactly the records up
// to the next segment's base, or Open fails with storage.ErrCorrupt). It scans the last segment
// frame by frame until a frame that is short, zero, or fails its checksum, then examines the rest
// of the file at 8-byte steps:
//
//   - nothing but zeros: a clean end;
//   - non-zero bytes but no frame that verifies: a torn write. The bytes are zeroed (so a stale
//     frame can never reappear after later appends) and Open logs a WARN, keeping every record
//     before it;
//   - a frame that verifies: corruption. Open fails with an error wrapping storage.ErrCorrupt
//     that names the file and the offset of the bad frame.
//
// A last segment shorter than its header is recreated empty; one shorter than FirstSegmentBytes
// (which only damage makes) is extended to it; any other keeps its size, whatever SegmentBytes
// is now. Damage to a sealed segment that has a valid index is found by Read (every
// frame's checksum is verified on read) and by Verify, not by Open: recovery time does not grow
// with retained history.
//
// Limits of this design: a bit flip in the very last record of the last segment looks like a torn
// write and the record is dropped. A power loss that persists a later page of an unsynced round but
// not an earlier one leaves a valid frame after a hole, which Open reports as corruption (the
// conservative reading). After a crash (no clean Close) Open reads the whole last segment.
//
// # Open files
//
// Each segment's file is held by a handle of a Files pool, which the logs of an engine share
// (Options.Files). Every read pins the files of the segments it reads for the duration of the read
// (so that plan's spans stay readable without a lock), and a group-commit round pins the active
// segment (and the one it rolls to) until its records are published. Unpinned open files are idle;
// past the pool's bound the idle ones unused the longest are closed and opened again on their next
// use. A busy log's active segment is pinned or recently used, so it is not closed between its
// rounds: its fdatasyncs, preallocation and zero-filled blocks are those of one file whatever the
// bound (closing a file keeps its data and its allocation; fdatasync acts on the inode, whichever
// descriptor it is called on). Pinned files are never closed, so the bound is exceeded only by
// files in use at the same moment. A spare counts as open while it is prepared and is closed once
// ready (kept open with KeepSpare: a roll then needs no new descriptor, though the spare that
// replaces it does); a spare whose preparation failed is prepared again by a later round, at most
// once a second (spareRetry, Options.Clock). Options.PinActive keeps the active segment open for
// good (the engine's state log). The bound is the pool's share of the process's descriptors, and
// the rest (connections) can run out first: an open of the pool (a segment opened again, a new
// segment, a spare) that fails with EMFILE or ENFILE closes half of the idle files, least recently
// used first, and is tried once more (FilesStats.Shed counts them). A round whose active segment
// still cannot be opened fails with ErrNotOpened, having written nothing; the log goes on.
//
// # Concurrency
//
// Read, Scan, SearchTime, Segments, FirstIndex and NextIndex are safe concurrently with appends,
// Cut and DeleteBefore, and never wait for a sync. Lock order: Log.wmu (writer) before Log.mu
// (segment list, published index) before Files.mu (handles); Log.mu and Files.mu are never held
// across I/O.
package wlog
