package wlog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/spoolmq/spool/internal/storage"
)

// The on-disk format (see doc.go for the diagrams). Every constant in this block is part of the
// on-disk format; never change one: bump formatVersion and keep reading the old version instead.
const (
	// segmentMagic opens every segment file. Part of the on-disk format; never change.
	segmentMagic = "SPLW"
	// indexMagic opens every sidecar index file. Part of the on-disk format; never change.
	indexMagic = "SPLI"
	// formatVersion is the version of segment files this code writes and reads. Part of the
	// on-disk format; never change (add a new version).
	formatVersion = 1
	// indexVersion is the version of sidecar index files. Part of the on-disk format; never change.
	indexVersion = 1

	// SegmentHeaderBytes is the size of the segment header; the first frame starts right after it.
	// Part of the on-disk format; never change.
	SegmentHeaderBytes = 32
	// FrameHeaderBytes is the size of a frame header: length, checksum and timestamp. Part of the
	// on-disk format; never change.
	FrameHeaderBytes = 16
	// FrameAlign is the alignment of every frame, relative to the start of the segment file. Part of
	// the on-disk format; never change.
	FrameAlign = 8

	// indexHeaderBytes is the fixed part of a sidecar index file. Part of the on-disk format; never
	// change.
	indexHeaderBytes = 48

	// maxRecordBytesLimit is the largest MaxRecordBytes a log accepts (frame offsets are uint32).
	maxRecordBytesLimit = 1 << 30
	// maxSegmentBytesLimit is the largest SegmentBytes a log accepts (frame offsets are uint32).
	maxSegmentBytesLimit = 1 << 31
	// minSegmentBytes is the smallest SegmentBytes a log accepts.
	minSegmentBytes = 1 << 10

	segmentExt = ".seg"
	indexExt   = ".idx"
	tmpExt     = ".tmp"
	// baseDigits is the width of the zero-padded base index in file names.
	baseDigits = 20
)

// castagnoli is the CRC-32C table. Part of the on-disk format; never change.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FrameBytes is the number of bytes a record with a body of bodyLen bytes takes in a segment:
// frame header, body and padding to FrameAlign.
func FrameBytes(bodyLen int) int64 {
	return align(int64(FrameHeaderBytes + bodyLen))
}

func align(n int64) int64 { return (n + FrameAlign - 1) &^ (FrameAlign - 1) }

// segmentName is the file name of the segment whose first record has index base.
func segmentName(base int64) string { return fmt.Sprintf("%0*d%s", baseDigits, base, segmentExt) }

// indexName is the file name of the sidecar index of the segment based at base.
func indexName(base int64) string { return fmt.Sprintf("%0*d%s", baseDigits, base, indexExt) }

// parseBase parses a segment or index file name made by segmentName or indexName.
func parseBase(name, ext string) (int64, bool) {
	digits, ok := strings.CutSuffix(name, ext)
	if !ok || len(digits) != baseDigits {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	base, err := strconv.ParseInt(digits, 10, 64)
	return base, err == nil
}

// segmentHeader is the decoded segment header.
type segmentHeader struct {
	base    int64
	created int64
}

// appendHeader encodes a segment header:
//
//	0  magic "SPLW"   4  version u32   8  base index i64   16  created unix ns i64
//	24 reserved u32 (0)   28  crc32c of bytes 0..28 u32
func appendHeader(dst []byte, h segmentHeader) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, SegmentHeaderBytes)...)
	b := dst[n:]
	copy(b[0:4], segmentMagic)
	binary.LittleEndian.PutUint32(b[4:], formatVersion)
	binary.LittleEndian.PutUint64(b[8:], uint64(h.base))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.created))
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return dst
}

// parseHeader decodes a segment header. It returns a short description of what is wrong.
func parseHeader(b []byte) (segmentHeader, string) {
	if len(b) < SegmentHeaderBytes {
		return segmentHeader{}, "short segment header"
	}
	if string(b[0:4]) != segmentMagic {
		return segmentHeader{}, "bad segment magic"
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:]) {
		return segmentHeader{}, "segment header checksum mismatch"
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != formatVersion {
		return segmentHeader{}, fmt.Sprintf("unsupported segment format version %d", v)
	}
	return segmentHeader{
		base:    int64(binary.LittleEndian.Uint64(b[8:])),
		created: int64(binary.LittleEndian.Uint64(b[16:])),
	}, ""
}

// appendFrame encodes one frame, padding included, at the end of dst:
//
//	0 length u32 = 8 + len(body)   4 crc32c u32 over length, timestamp and body
//	8 timestamp i64   16 body   then zero padding to FrameAlign
func appendFrame(dst []byte, ts int64, body []byte) []byte {
	n := len(dst)
	total := int(FrameBytes(len(body)))
	if cap(dst)-n < total {
		grown := make([]byte, n, 2*cap(dst)+total)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n+total]
	f := dst[n:]
	binary.LittleEndian.PutUint32(f[0:], uint32(8+len(body)))
	binary.LittleEndian.PutUint64(f[8:], uint64(ts))
	copy(f[FrameHeaderBytes:], body)
	clear(f[FrameHeaderBytes+len(body):])
	binary.LittleEndian.PutUint32(f[4:], frameCRC(f[0:4], f[8:FrameHeaderBytes+len(body)]))
	return dst
}

// frameCRC is the checksum of a frame: CRC-32C over the length word, then timestamp and body.
// Covering the length word means a damaged length never passes for a shorter or longer record.
func frameCRC(lengthWord, rest []byte) uint32 {
	return crc32.Update(crc32.Checksum(lengthWord, castagnoli), castagnoli, rest)
}

// frameCheck reports why the bytes in b (which start with a frame header and hold at least the
// whole frame when it is plausible) are not a valid frame, or "" when they are. maxLen bounds the
// length word; b may be longer than the frame.
func frameCheck(b []byte, maxLen int) string {
	if len(b) < FrameHeaderBytes {
		return "short frame header"
	}
	l := binary.LittleEndian.Uint32(b[0:4])
	switch {
	case l == 0:
		return "zero length word"
	case l < 8 || int64(l) > int64(maxLen)+8:
		return fmt.Sprintf("invalid frame length %d", l)
	case int64(len(b)) < 8+int64(l):
		return "frame extends past end of data"
	}
	if frameCRC(b[0:4], b[8:8+l]) != binary.LittleEndian.Uint32(b[4:8]) {
		return "frame checksum mismatch"
	}
	return ""
}

// CorruptError is damage found in a segment file: errors.Is(err, storage.ErrCorrupt) holds, and
// errors.As gives the file and the byte offset (the start of the first damaged frame, or of the
// header) to repair tools (Inspect).
type CorruptError struct {
	Path   string
	Offset int64
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%v: in file %q at offset %d: %s", storage.ErrCorrupt, e.Path, e.Offset, e.Reason)
}

// Unwrap returns storage.ErrCorrupt.
func (e *CorruptError) Unwrap() error { return storage.ErrCorrupt }

// corruptf returns a *CorruptError naming the file and byte offset.
func corruptf(path string, off int64, format string, args ...any) error {
	return &CorruptError{Path: path, Offset: off, Reason: fmt.Sprintf(format, args...)}
}

// sidecar is the content of a sidecar index file.
type sidecar struct {
	base    int64
	pos     []uint32
	minTime int64
	maxTime int64
	end     int64
}

// encodeIndex encodes a sidecar index file:
//
//	0  magic "SPLI"   4  version u32   8  base i64   16  count u64   24  min time i64
//	32 max time i64   40  data end u64   48  count x frame offset u32   then crc32c u32 of all before
func encodeIndex(sc sidecar) []byte {
	b := make([]byte, indexHeaderBytes+4*len(sc.pos)+4)
	copy(b[0:4], indexMagic)
	binary.LittleEndian.PutUint32(b[4:], indexVersion)
	binary.LittleEndian.PutUint64(b[8:], uint64(sc.base))
	binary.LittleEndian.PutUint64(b[16:], uint64(len(sc.pos)))
	binary.LittleEndian.PutUint64(b[24:], uint64(sc.minTime))
	binary.LittleEndian.PutUint64(b[32:], uint64(sc.maxTime))
	binary.LittleEndian.PutUint64(b[40:], uint64(sc.end))
	p := b[indexHeaderBytes:]
	for i, v := range sc.pos {
		binary.LittleEndian.PutUint32(p[4*i:], v)
	}
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	return b
}

// decodeIndex decodes and validates a sidecar index file against the size of its segment file.
// It allocates at most len(b) bytes.
func decodeIndex(b []byte, segSize int64) (sidecar, string) {
	if len(b) < indexHeaderBytes+4 {
		return sidecar{}, "short index file"
	}
	if string(b[0:4]) != indexMagic {
		return sidecar{}, "bad index magic"
	}
	n := len(b) - 4
	if crc32.Checksum(b[:n], castagnoli) != binary.LittleEndian.Uint32(b[n:]) {
		return sidecar{}, "index checksum mismatch"
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != indexVersion {
		return sidecar{}, fmt.Sprintf("unsupported index version %d", v)
	}
	count := binary.LittleEndian.Uint64(b[16:])
	if count != uint64(n-indexHeaderBytes)/4 || (n-indexHeaderBytes)%4 != 0 {
		return sidecar{}, "index count does not match its size"
	}
	sc := sidecar{
		base:    int64(binary.LittleEndian.Uint64(b[8:])),
		minTime: int64(binary.LittleEndian.Uint64(b[24:])),
		maxTime: int64(binary.LittleEndian.Uint64(b[32:])),
		end:     int64(binary.LittleEndian.Uint64(b[40:])),
		pos:     make([]uint32, count),
	}
	prev := int64(SegmentHeaderBytes - FrameHeaderBytes)
	for i := range sc.pos {
		v := binary.LittleEndian.Uint32(b[indexHeaderBytes+4*i:])
		if int64(v) < prev+FrameHeaderBytes || v%FrameAlign != 0 {
			return sidecar{}, "index positions out of order"
		}
		sc.pos[i] = v
		prev = int64(v)
	}
	switch {
	case count == 0 && sc.end != SegmentHeaderBytes:
		return sidecar{}, "empty index with a non-empty data end"
	case count > 0 && (sc.end < prev+FrameHeaderBytes || sc.end%FrameAlign != 0):
		return sidecar{}, "index data end out of range"
	case sc.end > segSize:
		return sidecar{}, "index data end beyond the segment file"
	}
	return sc, ""
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
