package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// A resubscription after a reconnect names the subscription it had (SubscribeParams.Rejoin,
// protocol version 5's Subscribe.rejoin). Without it, a Subscribe of a group whose subscription
// was cancelled while the client was away made a new one (CANCELLED is terminal), and one of a
// topic deleted meanwhile registered a binding that waited for the topic: durable state the user
// never asked for, left without members. A rejoining Subscribe creates nothing of the kind: it
// joins the group's subscription if that is still the one it names, and is refused otherwise.

// checkRejoin validates SubscribeParams.Rejoin: a subscription id, for a topic name.
func checkRejoin(p *SubscribeParams) error {
	switch {
	case p.Rejoin < 0:
		return invalid("rejoin must be a subscription id, got %d", p.Rejoin)
	case p.Rejoin != 0 && names.IsPattern(p.Pattern):
		return invalid("rejoin needs a topic name, not a pattern (%q)", p.Pattern)
	}
	return nil
}

// rejoining returns the subscription m's Subscribe rejoins, 0 when it may create (no Rejoin, or
// Subscribe returned).
func (m *Member) rejoining() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rejoin
}

// rejoined ends the rejoin checks of m once its Subscribe attached it: later attachments (a topic
// created again, a semantics change) follow the usual rules.
func (m *Member) rejoined() {
	m.mu.Lock()
	m.rejoin = 0
	m.mu.Unlock()
}

// rejoinTopicMissing is the refusal of a rejoining Subscribe whose topic does not exist.
func rejoinTopicMissing(id int64, topic string, err error) error {
	return fmt.Errorf("broker: rejoin subscription %d of topic %q: %w; nothing was created", id, topic, err)
}

// rejoinRefusal says why m, whose Subscribe rejoins a subscription, must neither join nor create
// group's subscription of topic, as found by SubscriptionGetByGroup (found, or foundErr). It
// returns nil when m may go on: no rejoin (or an attachment to a topic created later), found is
// the subscription m rejoins and has not ended, or that one still lives under another group (a semantics change
// renamed it: m goes where a connected member was moved, reattachTopic). Otherwise the one m
// rejoins ended while its client was away: SUBSCRIPTION_NOT_ACTIVE when it was cancelled,
// SUBSCRIPTION_NOT_FOUND when it was deleted or belongs to no topic of that name any more.
func (b *Broker) rejoinRefusal(ctx context.Context, m *Member, created bool, topic, group string,
	found *storage.Subscription, foundErr error) error {
	id := m.rejoining()
	switch {
	case id == 0 || created:
		return nil
	case foundErr == nil && found.ID == id && found.State != storage.Cancelled && found.State != storage.Deleted:
		return nil
	case foundErr != nil && !errors.Is(foundErr, storage.ErrSubscriptionNotFound):
		return nil // the caller reports it
	}
	had, err := b.engine.SubscriptionGet(ctx, id)
	switch {
	case errors.Is(err, storage.ErrSubscriptionNotFound), errors.Is(err, storage.ErrTopicNotFound):
		return fmt.Errorf("%w: subscription %d of group %q on topic %q, which the member rejoins, no longer exists; nothing was created",
			storage.ErrSubscriptionNotFound, id, group, topic)
	case err != nil:
		return fmt.Errorf("broker: rejoin subscription %d: %w", id, err)
	case had.Topic != topic || had.State == storage.Deleted:
		// A topic deleted and created again: subscription ids are never reused.
		return fmt.Errorf("%w: subscription %d, which the member rejoins, is not one of topic %q any more; nothing was created",
			storage.ErrSubscriptionNotFound, id, topic)
	case had.State == storage.Cancelled:
		return fmt.Errorf("%w: subscription %d of group %q on topic %q, which the member rejoins, was cancelled; nothing was created",
			storage.ErrSubscriptionNotActive, id, group, topic)
	}
	return nil
}
