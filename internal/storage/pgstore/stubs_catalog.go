package pgstore

// Stubs owned by the catalog helper (topics, subscriptions, bindings).
// Replace each with the real implementation in its own file.

import (
	"context"
	"errors"

	"github.com/spoolmq/spool/internal/storage"
)

// errTODO is returned by stubs; it disappears with the last one.
var errTODO = errors.New("pgstore: not implemented yet")

func (e *Engine) BindingCreate(ctx context.Context, p *storage.BindingCreateParams) (*storage.Binding, error) {
	return nil, errTODO
}
func (e *Engine) BindingDelete(ctx context.Context, p *storage.BindingDeleteParams) error {
	return errTODO
}
func (e *Engine) BindingList(ctx context.Context) ([]*storage.Binding, error) { return nil, errTODO }
func (e *Engine) SubscriptionCreate(ctx context.Context, p *storage.SubscriptionCreateParams) (*storage.Subscription, error) {
	return nil, errTODO
}
func (e *Engine) SubscriptionDelete(ctx context.Context, id int64) error { return errTODO }
func (e *Engine) SubscriptionGet(ctx context.Context, id int64) (*storage.Subscription, error) {
	return nil, errTODO
}
func (e *Engine) SubscriptionGetByGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	return nil, errTODO
}
func (e *Engine) SubscriptionList(ctx context.Context, p *storage.SubscriptionListParams) ([]*storage.Subscription, error) {
	return nil, errTODO
}
func (e *Engine) SubscriptionUpdate(ctx context.Context, p *storage.SubscriptionUpdateParams) (*storage.Subscription, error) {
	return nil, errTODO
}
func (e *Engine) TopicCreate(ctx context.Context, p *storage.TopicCreateParams) (*storage.Topic, error) {
	return nil, errTODO
}
func (e *Engine) TopicDelete(ctx context.Context, p *storage.TopicDeleteParams) error { return errTODO }
func (e *Engine) TopicGet(ctx context.Context, name string) (*storage.Topic, error) {
	return nil, errTODO
}
func (e *Engine) TopicList(ctx context.Context) ([]*storage.Topic, error) { return nil, errTODO }
func (e *Engine) TopicUpdate(ctx context.Context, p *storage.TopicUpdateParams) (*storage.Topic, error) {
	return nil, errTODO
}
