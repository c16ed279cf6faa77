package wal

import "github.com/spoolmq/spool/internal/storage"

// NotifyRegister registers fn to be called after messages were appended to a topic, a topic was
// created or deleted, or a subscription's state or group changed (storage.NotifySubscription).
// fn is called on the goroutine that made the change, after it is durable and
// with no engine lock held; it must not block. The returned function unregisters fn (safe to call
// more than once).
func (e *Engine) NotifyRegister(fn func(storage.Notification)) (unregister func()) {
	if fn == nil {
		return func() {}
	}
	e.notifyMu.Lock()
	e.notifySeq++
	id := e.notifySeq
	e.notifyFns[id] = fn
	e.notifyMu.Unlock()
	return func() {
		e.notifyMu.Lock()
		delete(e.notifyFns, id)
		e.notifyMu.Unlock()
	}
}

func (e *Engine) notify(n storage.Notification) {
	e.notifyMu.Lock()
	if len(e.notifyFns) == 0 {
		e.notifyMu.Unlock()
		return
	}
	fns := make([]func(storage.Notification), 0, len(e.notifyFns))
	for _, fn := range e.notifyFns {
		fns = append(fns, fn)
	}
	e.notifyMu.Unlock()
	for _, fn := range fns {
		fn(n)
	}
}

// subscriptionChanged notifies that subscription id of topic changed state or group
// (storage.NotifySubscription). Call it once the change is durable, without e.mu held.
func (e *Engine) subscriptionChanged(topic string, id int64) {
	e.notify(storage.Notification{Kind: storage.NotifySubscription, Topic: topic, SubscriptionID: id})
}
