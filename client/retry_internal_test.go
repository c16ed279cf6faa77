package client

import (
	"fmt"
	"testing"

	"github.com/spoolmq/spool/protocol"
)

// TestRetryPublishStorageCodes: STORAGE_UNAVAILABLE and STORAGE_FULL mean nothing was stored, so
// a publish is retried even without producer ids; INTERNAL (outcome unknown) only with them.
func TestRetryPublishStorageCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err        *protocol.Error
		idempotent bool
		want       bool
	}{
		{protocol.ErrStorageUnavailable, false, true},
		{protocol.ErrStorageFull, false, true},
		{protocol.ErrInternal, false, false},
		{protocol.ErrInternal, true, true},
	} {
		err := fmt.Errorf("client: publish: %w", c.err.WithMessage("x"))
		if got, _ := retryPublish(err, false, c.idempotent); got != c.want {
			t.Errorf("retryPublish(%s, idempotent %v) = %v, want %v", c.err.Name, c.idempotent, got, c.want)
		}
		if !IsRetryable(err) {
			t.Errorf("IsRetryable(%s) = false", c.err.Name)
		}
	}
}
