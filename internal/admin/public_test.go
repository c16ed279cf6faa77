package admin

import (
	"testing"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/storage"
)

// TestPublicEnums: the enum values of package client/admin, which the API's JSON types use, are
// the engine's (the server converts between them by value, so a value that differs would reach
// clients under a name they do not know).
func TestPublicEnums(t *testing.T) {
	t.Parallel()
	for _, p := range [][2]string{
		{string(api.Queue), string(storage.Queue)}, {string(api.PubSub), string(storage.PubSub)},
		{string(api.Watermark), string(storage.Watermark)}, {string(api.Refcount), string(storage.Refcount)},
		{string(api.BacklogReject), string(storage.BacklogReject)}, {string(api.BacklogThrottle), string(storage.BacklogThrottle)},
		{string(api.SizeKeepNeeded), string(storage.SizeKeepNeeded)}, {string(api.SizeDropOldest), string(storage.SizeDropOldest)},
		{string(api.Active), string(storage.Active)}, {string(api.Paused), string(storage.Paused)},
		{string(api.Dead), string(storage.Dead)}, {string(api.Cancelled), string(storage.Cancelled)},
		{string(api.Deleted), string(storage.Deleted)},
		{string(api.FromNow), string(storage.FromNow)}, {string(api.FromBeginning), string(storage.FromBeginning)},
		{string(api.FromTimestamp), string(storage.FromTimestamp)}, {string(api.FromMessageID), string(storage.FromMessageID)},
		{string(api.BackfillNotStarted), string(storage.BackfillNotStarted)},
		{string(api.BackfillInProgress), string(storage.BackfillInProgress)},
		{string(api.BackfillCompleted), string(storage.BackfillCompleted)},
		{string(api.BackfillCancelled), string(storage.BackfillCancelled)},
		{string(api.BackfillFailed), string(storage.BackfillFailed)},
		{string(api.CompletionPending), string(storage.CompletionPending)},
		{string(api.CompletionAcked), string(storage.CompletionAcked)},
		{string(api.CompletionDeadLettered), string(storage.CompletionDeadLettered)},
		{string(api.CompletionRemoved), string(storage.CompletionRemoved)},
		{api.QueueGroup, storage.QueueGroup},
	} {
		if p[0] != p[1] {
			t.Errorf("client/admin has %q where the engine has %q", p[0], p[1])
		}
	}
}
