package wal

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
)

// This file applies state records to the in-memory maps. Metadata changes are made only through
// these functions, live (with e.mu held exclusively, right before the record is queued) and on
// replay, so a restart rebuilds exactly what was live. Delivery-state records (claim, ack, nack,
// DLQ) are applied live by the substate methods the operations call, and here by their Restore
// counterparts.

func (e *Engine) applyTopicCreate(r *topicCreateRec) {
	t := &topic{meta: r.Topic, subs: make(map[int64]*sub)}
	e.topics[r.Topic.Name] = t
	for i := range r.Subs {
		e.applySubCreate(t, &r.Subs[i])
	}
}

// startOffsets is what the metadata keeps of a subscription's start offsets: nil when all are 0
// (read as zeros), so the metadata of such subscriptions keeps the bytes it had before start
// offsets were kept (golden_test.go); a subscription restored from such metadata made before
// then reads as starting at 0, which can only overstate its progress.
func startOffsets(starts []int64) []int64 {
	if !slices.ContainsFunc(starts, func(o int64) bool { return o != 0 }) {
		return nil
	}
	return slices.Clone(starts)
}

func (e *Engine) applySubCreate(t *topic, r *subRec) *sub {
	if old := e.subs[r.Sub.ID]; old != nil && old.topic == t {
		// SubscriptionConfigure of a new start (no progress): the same subscription, started again.
		old.meta = r.Sub
		old.meta.StartOffsets = startOffsets(r.Starts)
		old.st = substate.New(r.Starts)
		for old.st.Partitions() < t.meta.Config.Partitions {
			old.st.AddPartition(0)
		}
		markSkipped(old, r.Skips)
		return old
	}
	s := &sub{meta: r.Sub, topic: t, st: substate.New(r.Starts), lastBeat: r.Sub.CreatedAt}
	s.meta.StartOffsets = startOffsets(r.Starts)
	// Partitions added after the record was written start at 0.
	for s.st.Partitions() < t.meta.Config.Partitions {
		s.st.AddPartition(0)
	}
	markSkipped(s, r.Skips)
	e.subs[s.meta.ID] = s
	t.subs[s.meta.ID] = s
	e.nextSubID = max(e.nextSubID, s.meta.ID+1)
	return s
}

func (e *Engine) applyTopicUpdate(r *topicUpdateRec) {
	t := e.topics[r.Name]
	if t == nil {
		return
	}
	old := t.meta.Config.Partitions
	t.meta.Config = r.Config
	for _, s := range t.subs {
		if s.st == nil {
			continue
		}
		for i := old; i < r.Config.Partitions; i++ {
			s.st.AddPartition(0)
		}
	}
	for _, rn := range r.Renames {
		if s := t.subs[rn.ID]; s != nil {
			s.meta.Group = rn.Group
			s.meta.UpdatedAt = r.At
		}
	}
	for i := range r.NewSubs {
		e.applySubCreate(t, &r.NewSubs[i])
	}
}

// applyTopicDelete deletes the topic with its subscriptions and the bindings on its name: a
// binding whose pattern is the plain topic name (a durable group's Subscribe of a topic that did
// not exist yet) was for this topic only, and left alone it would subscribe the group, without
// members, to a topic created later under the name. Wildcard bindings stay: they bind topics
// created later by design. The record does not list the bindings: replay, which applies the
// records in the order they were made, removes the same ones.
func (e *Engine) applyTopicDelete(r *topicDeleteRec) {
	t := e.topics[r.Name]
	if t == nil {
		return
	}
	for _, s := range t.subs {
		e.applySubDelete(&subDeleteRec{ID: s.meta.ID, At: r.At})
	}
	maps.DeleteFunc(e.bindings, func(k bindingKey, _ *storage.Binding) bool { return k.pattern == r.Name })
	t.dedup.drop(&e.dedupIDs)
	delete(e.topics, r.Name)
}

func (e *Engine) applySubUpdate(r *subUpdateRec) {
	s := e.subs[r.ID]
	if s == nil || s.meta.State == storage.Deleted {
		return
	}
	if r.State == storage.Deleted {
		e.applySubDelete(&subDeleteRec{ID: r.ID, At: r.At})
		return
	}
	if r.State == storage.Active && s.meta.State != storage.Active {
		s.lastBeat = r.At // resumed or resurrected: a fresh heartbeat timeout
	}
	s.meta.State = r.State
	s.meta.UpdatedAt = r.At
	if r.HeartbeatTimeout != 0 {
		s.meta.HeartbeatTimeout = heartbeatTimeoutField(r.HeartbeatTimeout)
	}
	if r.State == storage.Cancelled {
		s.st = nil
		e.dropDLQ(s)
	}
}

func (e *Engine) applySubDelete(r *subDeleteRec) {
	s := e.subs[r.ID]
	if s == nil {
		return
	}
	if s.topic != nil {
		delete(s.topic.subs, r.ID)
	}
	s.topic = nil
	s.st = nil
	s.rc = nil // a DELETED subscription is in no completion record
	e.dropDLQ(s)
	if s.meta.Ephemeral {
		delete(e.subs, r.ID)
		return
	}
	s.meta.State = storage.Deleted
	s.meta.UpdatedAt = r.At
}

// applyRecord applies one replayed state record.
func (e *Engine) applyRecord(body []byte) error {
	if len(body) == 0 {
		return fmt.Errorf("empty state record")
	}
	typ := body[0]
	unmarshal := func(v any) error {
		if err := json.Unmarshal(body[1:], v); err != nil {
			return fmt.Errorf("decode state record %d: %w", typ, err)
		}
		return nil
	}
	switch typ {
	case recMarker:
	case recTopicCreate:
		var r topicCreateRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		e.applyTopicCreate(&r)
	case recTopicUpdate:
		var r topicUpdateRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		e.applyTopicUpdate(&r)
	case recTopicDelete:
		var r topicDeleteRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		e.applyTopicDelete(&r)
	case recBindingCreate:
		var b storage.Binding
		if err := unmarshal(&b); err != nil {
			return err
		}
		e.bindings[bindingKey{b.Group, b.Pattern}] = &b
	case recBindingDelete:
		var r bindingDeleteRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		delete(e.bindings, bindingKey{r.Group, r.Pattern})
	case recSubCreate:
		var r subRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		if t := e.topics[r.Sub.Topic]; t != nil {
			e.applySubCreate(t, &r)
		}
	case recSubUpdate:
		var r subUpdateRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		e.applySubUpdate(&r)
	case recSubDelete:
		var r subDeleteRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		e.applySubDelete(&r)
	case recSubBackfill:
		var r subBackfillRec
		if err := unmarshal(&r); err != nil {
			return err
		}
		e.applySubBackfill(&r)
	case recSubAssign:
		var a storage.Assignment
		if err := unmarshal(&a); err != nil {
			return err
		}
		e.applyAssign(&a)
	case recClaim:
		id, items, cursors, err := decodeClaim(body)
		if err != nil {
			return err
		}
		st := e.stateOf(id)
		if st == nil {
			return nil
		}
		for _, it := range items {
			switch it.kind {
			case claimDeliver:
				st.RestoreClaim(it.partition, it.offset, int(it.n), false)
			case claimReplayed:
				st.RestoreClaim(it.partition, it.offset, int(it.n), true)
			case claimDelay:
				st.Delay(it.partition, it.offset, it.n)
			case claimComplete:
				st.Complete(it.partition, it.offset)
			default:
				return fmt.Errorf("claim record: unknown item kind %d", it.kind)
			}
		}
		for _, c := range cursors {
			st.RestoreCursor(c.partition, c.cursor)
		}
	case recAck:
		id, refs, err := decodeAck(body)
		if err != nil {
			return err
		}
		if s := e.subs[id]; s != nil && s.st != nil {
			for _, r := range refs {
				if s.st.Ack(r.Partition, r.Offset, substate.Forever) == substate.Acked {
					recordCompletionLocked(s, r.Partition, r.Offset, e.replayAt, runAcked)
				}
			}
		}
	case recNack:
		id, items, err := decodeNack(body)
		if err != nil {
			return err
		}
		if st := e.stateOf(id); st != nil {
			for _, it := range items {
				st.RestoreNack(it.partition, it.offset, it.due, it.replayed, it.givenBack)
			}
		}
	case recFailure:
		id, items, err := decodeFailures(body)
		if err != nil {
			return err
		}
		if st := e.stateOf(id); st != nil {
			for _, it := range items {
				st.RestoreFailure(it.partition, it.offset, it.replayed, it.f)
			}
		}
	case recDLQ:
		id, de, err := decodeDLQ(body)
		if err != nil {
			return err
		}
		if s := e.subs[id]; s != nil && s.st != nil {
			s.st.DeadLetterAt(de.Message.Partition, de.Message.Offset, de.ID)
			recordCompletionLocked(s, de.Message.Partition, de.Message.Offset, de.DeadAt.UnixNano(), runDLQ)
			if err := e.dlqReplayEntry(s, de); err != nil {
				return err
			}
		}
	case recDLQReplay, recDLQPurge:
		id, at, ids, err := decodeDLQIDs(body)
		if err != nil {
			return err
		}
		// Records always list the IDs they moved: an empty list would mean "all" to DLQReplay and
		// DLQPurge.
		if s := e.subs[id]; s != nil && s.st != nil && len(ids) > 0 {
			if typ == recDLQReplay {
				if err := e.dlqSyncPending(s); err != nil {
					return err
				}
				if _, err := e.dlqOf(s, 0); err != nil {
					return err
				}
				e.replayDLQLocked(s, s.st.DLQSelect(ids), at, true)
			} else {
				s.st.DLQPurge(ids)
			}
		}
	case recRetention:
		floors, expired, err := decodeRetention(body)
		if err != nil {
			return err
		}
		for _, f := range floors {
			if st := e.stateOf(f.sub); st != nil {
				st.ForceFloor(f.partition, f.floor)
			}
		}
		for _, x := range expired {
			if st := e.stateOf(x.sub); st != nil && len(x.ids) > 0 {
				st.DLQPurge(x.ids)
			}
		}
	case recRejoin:
		id, leftAt, items, err := decodeRejoin(body)
		if err != nil {
			return err
		}
		if s := e.subs[id]; s != nil && s.st != nil {
			applyRejoin(s, leftAt, items)
		}
	case recSubIDs:
		next, err := decodeSubIDs(body)
		if err != nil {
			return err
		}
		e.nextSubID = max(e.nextSubID, next)
	case recCleanClose, recUnclean:
		if len(body) != 1 {
			return fmt.Errorf("state record %d: %d unexpected bytes", typ, len(body)-1)
		}
		if typ == recUnclean {
			e.applyUnclean()
		}
	case recHorizon:
		id, items, err := decodeHorizon(body)
		if err != nil {
			return err
		}
		if st := e.stateOf(id); st != nil {
			for _, it := range items {
				st.SetHorizon(it.partition, it.horizon)
			}
		}
	default:
		return fmt.Errorf("unknown state record type %d", typ)
	}
	return nil
}

// applyUnclean applies the restart rule after an unclean shutdown to every subscription (see
// substate.Sub.UncleanRestart): Open does it live and records it (recUnclean), so a replay
// rebuilds the same attempt counts.
func (e *Engine) applyUnclean() {
	for _, s := range e.subs {
		if s.st != nil {
			s.st.UncleanRestart()
		}
	}
}

func (e *Engine) stateOf(id int64) *substate.Sub {
	if s := e.subs[id]; s != nil {
		return s.st
	}
	return nil
}

// cloneSub returns a copy of a subscription's metadata for a caller.
func cloneSub(s *sub) *storage.Subscription {
	c := s.meta
	c.HeartbeatTimeout = cmp.Or(c.HeartbeatTimeout, storage.DefaultHeartbeatTimeout)
	c.LastHeartbeatAt = s.lastBeat
	c.StartOffsets = nil
	c.Backfill = c.Backfill.Clone()
	return &c
}

// cloneTopic returns a copy of a topic's metadata for a caller. Settings added after the topic's
// records were written (dedup_window) read as their defaults: the records keep the bytes they
// were written with (golden_test.go).
func cloneTopic(t *topic) *storage.Topic {
	c := t.meta
	c.Config = c.Config.WithDefaults()
	return &c
}
