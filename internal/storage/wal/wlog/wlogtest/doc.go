// Package wlogtest holds test helpers for code built on package wlog: ErrorFS, an FS that injects
// errors into chosen operations (fail the Nth sync, every rename from the 3rd on, ...) and counts
// the operations it ran. It wraps a real FS (the OS by default): a fake only at the OS seam.
//
//	efs := wlogtest.NewErrorFS(nil, nil)
//	l, _ := wlog.Open(dir, wlog.Options{FS: efs})
//	efs.SetInjector(wlogtest.FailNth(wlogtest.OpSync, 1, wlogtest.ErrInjected))
//	_, err := c.Append(ctx, l, recs) // errors.Is(err, wlogtest.ErrInjected), and so is every later append
package wlogtest
