package storage

import (
	"hash/fnv"
	"time"
)

// PartitionForKey returns the partition of a keyed message: FNV-1a of the key modulo n, computed
// on unsigned integers so it is never negative (the seeds' Math.abs(hashCode()) returns a negative
// partition for one key in 2^32). Part of the contract between engines and clients: never change.
func PartitionForKey(key []byte, n int) int32 {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write(key)
	return int32(h.Sum32() % uint32(n))
}

// Redelivery backoff after a lease expiry (BRIEF.md section 5): 1 s, 4 s, 16 s, 64 s, ... capped at
// 5 min.
const (
	BackoffBase = time.Second
	BackoffMax  = 5 * time.Minute
)

// RedeliveryBackoff returns the wait before a message whose attempt-th delivery expired becomes
// available again.
func RedeliveryBackoff(attempt int) time.Duration {
	d := BackoffBase
	for i := 1; i < attempt; i++ {
		d *= 4
		if d >= BackoffMax {
			return BackoffMax
		}
	}
	return d
}
