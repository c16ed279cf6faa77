package bench

import (
	"encoding/binary"
	"fmt"
	"time"
)

// StampSize is the size of the stamp at the start of every e2e payload: the run id, the
// message's sequence number and its intended send time, 8 bytes each, big-endian.
const StampSize = 24

// Stamp is what an e2e message carries to let its consumer measure its latency.
type Stamp struct {
	// Run identifies the run: messages of other runs on a reused topic are ignored.
	Run uint64
	// Seq is the message's index in the schedule.
	Seq uint64
	// Intended is when the schedule meant to send it (unix nanoseconds).
	Intended int64
}

// Put writes the stamp at the start of p (at least StampSize bytes).
func (s Stamp) Put(p []byte) {
	binary.BigEndian.PutUint64(p[0:], s.Run)
	binary.BigEndian.PutUint64(p[8:], s.Seq)
	binary.BigEndian.PutUint64(p[16:], uint64(s.Intended))
}

// ReadStamp reads the stamp at the start of p.
func ReadStamp(p []byte) (Stamp, error) {
	if len(p) < StampSize {
		return Stamp{}, fmt.Errorf("bench: payload of %d bytes has no stamp (%d bytes)", len(p), StampSize)
	}
	return Stamp{
		Run:      binary.BigEndian.Uint64(p[0:]),
		Seq:      binary.BigEndian.Uint64(p[8:]),
		Intended: int64(binary.BigEndian.Uint64(p[16:])),
	}, nil
}

// IntendedTime returns Intended as a time.
func (s Stamp) IntendedTime() time.Time { return time.Unix(0, s.Intended) }
