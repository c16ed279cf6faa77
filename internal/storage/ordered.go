package storage

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Ordered groups (issue 17 item 3): what the engines store and check. The broker decides the
// assignment (strategies, rebalances); the engines keep it, with its generation, durably and
// atomically (on PostgreSQL across broker instances), deliver each partition in offset order to
// its one owner, and fence requests of members that lost a partition.

// SubscriptionMode says how a subscription's messages are shared among its group's members.
type SubscriptionMode string

const (
	// ModeShared: any member gets any message. The default; stored and shown as "" so that
	// subscriptions stored before modes existed keep their bytes.
	ModeShared SubscriptionMode = ""
	// ModeOrdered: each partition is owned by one member at a time (SubscriptionAssign) and
	// delivered in offset order, at most MaxInFlightPerPartition unsettled.
	ModeOrdered SubscriptionMode = "ordered"
)

// Assignment strategies of ordered groups. The engines only store the name; the broker runs them
// (policy.Assign).
const (
	StrategyRoundRobin = "round-robin"
	StrategySticky     = "sticky"
)

// Bounds of ordered groups.
const (
	// DefaultMaxInFlightPerPartition is the default max_in_flight_per_partition.
	DefaultMaxInFlightPerPartition = 1
	// MaxInFlightPerPartitionLimit bounds max_in_flight_per_partition.
	MaxInFlightPerPartitionLimit = 1000
	// MaxAssignmentMembers bounds the members of one assignment.
	MaxAssignmentMembers = 10000
)

// ErrStaleGeneration is returned when a member of an ORDERED subscription acts on a partition it
// does not own in the subscription's current generation (it lost the partition in a rebalance,
// or never had it), claims with a generation that is not the current one, or when
// SubscriptionAssign's expected generation is not the current one. Nothing was changed; the
// member must rejoin (read the current assignment) and try again. Protocol STALE_GENERATION.
var ErrStaleGeneration = errors.New("stale generation")

// ErrModeConflict is returned by SubscriptionCreate when the group already has a subscription on
// the topic in another mode (or with other ordered settings): a mode cannot change. It wraps
// ErrSubscriptionExists (protocol SUBSCRIPTION_EXISTS).
var ErrModeConflict = fmt.Errorf("%w with another mode", ErrSubscriptionExists)

// Ordering is the normalized ordered-group setting of a subscription (SubscriptionCreateParams
// .Ordering): zero for a shared one.
type Ordering struct {
	Mode                    SubscriptionMode
	MaxInFlightPerPartition int
	Strategy                string
}

// Ordering returns the normalized mode settings of the parameters (Check them first): for
// ModeOrdered, MaxInFlightPerPartition defaults to 1 and Strategy to round-robin; for a shared
// subscription both are zero.
func (p *SubscriptionCreateParams) Ordering() Ordering {
	if p.Mode != ModeOrdered {
		return Ordering{}
	}
	o := Ordering{Mode: ModeOrdered, MaxInFlightPerPartition: p.MaxInFlightPerPartition, Strategy: p.Strategy}
	if o.MaxInFlightPerPartition == 0 {
		o.MaxInFlightPerPartition = DefaultMaxInFlightPerPartition
	}
	if o.Strategy == "" {
		o.Strategy = StrategyRoundRobin
	}
	return o
}

// Ordering returns the subscription's mode settings.
func (s *Subscription) Ordering() Ordering {
	return Ordering{Mode: s.Mode, MaxInFlightPerPartition: s.MaxInFlightPerPartition, Strategy: s.Strategy}
}

// checkOrdering validates the mode fields of SubscriptionCreateParams.
func (p *SubscriptionCreateParams) checkOrdering() error {
	switch p.Mode {
	case ModeShared, "shared":
		p.Mode = ModeShared
		if p.MaxInFlightPerPartition != 0 || p.Strategy != "" {
			return Invalid("max_in_flight_per_partition and strategy are for ordered subscriptions only")
		}
		return nil
	case ModeOrdered:
	default:
		return Invalid("subscription mode %q: want shared or ordered", p.Mode)
	}
	if p.Ephemeral {
		return Invalid("an ordered subscription cannot be ephemeral")
	}
	if p.MaxInFlightPerPartition < 0 || p.MaxInFlightPerPartition > MaxInFlightPerPartitionLimit {
		return Invalid("max_in_flight_per_partition must be between 1 and %d, got %d", MaxInFlightPerPartitionLimit, p.MaxInFlightPerPartition)
	}
	return CheckStrategy(p.Strategy)
}

// CheckStrategy validates an assignment strategy name; empty is allowed (the default).
func CheckStrategy(s string) error {
	switch s {
	case "", StrategyRoundRobin, StrategySticky:
		return nil
	}
	return Invalid("strategy %q: want %s or %s", s, StrategyRoundRobin, StrategySticky)
}

// SubscriptionAssignParams are the parameters of Engine.SubscriptionAssign.
type SubscriptionAssignParams struct {
	SubscriptionID int64
	// Generation is the generation the caller computed the assignment from (0 before the first
	// assignment): the engine applies it only if that is still the current one.
	Generation int64
	// Members maps each member to the partitions it owns. A partition appears at most once;
	// partitions not listed have no owner (nothing is delivered from them). Members with no
	// partition may be listed.
	Members map[string][]int32
	// Strategy, when not empty, replaces the stored strategy (a strategy change is a rebalance).
	Strategy string
}

// Check validates the parameters of SubscriptionAssign that do not depend on the state: member
// names, negative or repeated partitions, the number of members. Partitions at or above the
// topic's count are the engine's to refuse.
func (p *SubscriptionAssignParams) Check() error {
	if p == nil {
		return nilParams()
	}
	if p.Generation < 0 {
		return Invalid("generation must not be negative, got %d", p.Generation)
	}
	if len(p.Members) > MaxAssignmentMembers {
		return Invalid("assignment has %d members, at most %d", len(p.Members), MaxAssignmentMembers)
	}
	if err := CheckStrategy(p.Strategy); err != nil {
		return err
	}
	seen := map[int32]string{}
	for _, m := range slices.Sorted(maps.Keys(p.Members)) {
		if m == "" || len(m) > MaxGroupNameLen {
			return Invalid("member name must have 1 to %d bytes, got %d", MaxGroupNameLen, len(m))
		}
		for _, q := range p.Members[m] {
			if q < 0 || q >= MaxPartitions {
				return Invalid("member %q: partition %d out of range", m, q)
			}
			if o, dup := seen[q]; dup {
				return Invalid("partition %d assigned twice (members %q and %q)", q, o, m)
			}
			seen[q] = m
		}
	}
	return nil
}

// SubscriptionAssignResult is the result of Engine.SubscriptionAssign.
type SubscriptionAssignResult struct {
	// Assignment is the new assignment.
	Assignment *Assignment
	// DeadLettered counts the leases on their max_deliveries-th delivery, in the partitions
	// whose owner changed, that went to the DLQ (reason max_deliveries) instead of being given
	// back.
	DeadLettered int
}

// Assignment is the partition assignment of an ORDERED subscription.
type Assignment struct {
	SubscriptionID int64 `json:"subscription_id"`
	// Generation counts the assignments made (0: none yet). It never goes back, also across
	// restarts.
	Generation int64  `json:"generation"`
	Strategy   string `json:"strategy"`
	// Members maps each member to its partitions, sorted.
	Members map[string][]int32 `json:"members"`
	// Since gives, per partition of the topic, the generation from which its current owner owns
	// it (0: no owner). A ref of that partition carrying an older generation is stale.
	Since []int64 `json:"since"`
}

// Owner returns the member that owns partition p, or "".
func (a *Assignment) Owner(p int32) string {
	for m, ps := range a.Members {
		if slices.Contains(ps, p) {
			return m
		}
	}
	return ""
}

// NextAssignment computes the assignment that replaces cur (nil: none yet) for a topic with n
// partitions: generation + 1, Since kept for partitions that keep their owner. It returns the
// partitions whose owner changed (their leases must be dropped), sorted. It fails with
// ErrStaleGeneration when p.Generation is not cur's, and with ErrInvalidArgument for a
// partition at or above n. Both engines call it, so they agree.
func NextAssignment(cur *Assignment, p *SubscriptionAssignParams, n int, defaultStrategy string) (*Assignment, []int32, error) {
	gen, strategy := int64(0), defaultStrategy
	if cur != nil {
		gen, strategy = cur.Generation, cur.Strategy
	}
	if p.Generation != gen {
		return nil, nil, fmt.Errorf("%w: subscription %d is at generation %d, not %d", ErrStaleGeneration, p.SubscriptionID, gen, p.Generation)
	}
	if p.Strategy != "" {
		strategy = p.Strategy
	}
	next := &Assignment{SubscriptionID: p.SubscriptionID, Generation: gen + 1, Strategy: strategy,
		Members: make(map[string][]int32, len(p.Members)), Since: make([]int64, n)}
	owner := make([]string, n)
	for m, ps := range p.Members {
		for _, q := range ps {
			if int(q) >= n {
				return nil, nil, Invalid("member %q: partition %d out of range, the topic has %d", m, q, n)
			}
			owner[q] = m
		}
		sorted := slices.Clone(ps)
		slices.Sort(sorted)
		if sorted == nil {
			sorted = []int32{}
		}
		next.Members[m] = sorted
	}
	prev := make([]string, n)
	if cur != nil {
		for m, ps := range cur.Members {
			for _, q := range ps {
				if int(q) < n {
					prev[q] = m
				}
			}
		}
	}
	var moved []int32
	for q := range n {
		switch {
		case owner[q] == "":
		case owner[q] == prev[q] && cur != nil && q < len(cur.Since) && cur.Since[q] > 0:
			next.Since[q] = cur.Since[q]
		default:
			next.Since[q] = next.Generation
		}
		if owner[q] != prev[q] && prev[q] != "" {
			moved = append(moved, int32(q))
		}
	}
	return next, moved, nil
}

// Clone returns a deep copy.
func (a *Assignment) Clone() *Assignment {
	if a == nil {
		return nil
	}
	c := *a
	c.Members = make(map[string][]int32, len(a.Members))
	for m, ps := range a.Members {
		c.Members[m] = slices.Clone(ps)
	}
	c.Since = slices.Clone(a.Since)
	return &c
}

// Fence checks that member may act, with generation gen, on partition p of an ORDERED
// subscription whose assignment is a (nil: none yet): it owns p and gen is at least the
// generation from which it owns it and not above the current one. The error wraps
// ErrStaleGeneration.
func (a *Assignment) Fence(member string, gen int64, p int32) error {
	if a == nil {
		return fmt.Errorf("%w: no assignment yet (member %q, generation %d)", ErrStaleGeneration, member, gen)
	}
	switch {
	case gen > a.Generation:
		return fmt.Errorf("%w: generation %d is ahead of the current %d", ErrStaleGeneration, gen, a.Generation)
	case int(p) < 0 || int(p) >= len(a.Since) || a.Since[p] == 0 || !slices.Contains(a.Members[member], p):
		return fmt.Errorf("%w: partition %d is not assigned to member %q in generation %d", ErrStaleGeneration, p, member, a.Generation)
	case gen < a.Since[p]:
		return fmt.Errorf("%w: member %q owns partition %d since generation %d, the request carries %d", ErrStaleGeneration, member, p, a.Since[p], gen)
	}
	return nil
}

// ClaimPartitions checks an ordered claim's generation and returns the partitions it may read:
// the member's in the current generation, limited to filter when it is not nil (none before the
// first assignment, generation 0). The error wraps
// ErrStaleGeneration when gen is not the current generation.
func (a *Assignment) ClaimPartitions(member string, gen int64, filter []int32) ([]int32, error) {
	cur := int64(0)
	if a != nil {
		cur = a.Generation
	}
	if gen != cur {
		return nil, fmt.Errorf("%w: claim with generation %d, the current one is %d", ErrStaleGeneration, gen, cur)
	}
	if a == nil {
		return []int32{}, nil // no assignment yet: nothing to read
	}
	ps := a.Members[member]
	out := make([]int32, 0, len(ps))
	for _, q := range ps {
		if filter == nil || slices.Contains(filter, q) {
			out = append(out, q)
		}
	}
	return out, nil
}

// Member liveness of ordered groups (SubscriptionMembersRenew). With several broker instances on
// one database, a member listed in an assignment is connected to one instance, which renews its
// liveness record; when the instance dies, its members expire and another instance's rebalance
// leaves them out, so their partitions get new owners.
//
// Member filters use the same records (shared subscriptions): each record names the instance
// that renews it and the member's filter, so an instance routing a message none of its own
// members wants knows whether a live member of another instance does (docs/storage.md).

// Bounds of SubscriptionMembersRenew.
const (
	// MaxRenewMembers bounds the members of one SubscriptionMembersRenew call.
	MaxRenewMembers = 10000
	// MinMemberTTL and MaxMemberTTL bound a liveness record's TTL.
	MinMemberTTL = 100 * time.Millisecond
	MaxMemberTTL = 24 * time.Hour
	// MaxMemberFilterLen bounds a recorded member filter (the filter package's MaxLen).
	MaxMemberFilterLen = 1024
)

// MemberRef names a member of a subscription.
type MemberRef struct {
	SubscriptionID int64
	Member         string
	// Filter is the member's filter text ("": none), recorded with its liveness so that other
	// broker instances know what it wants; at most MaxMemberFilterLen bytes.
	Filter string
}

// MemberRecord is a live member's record (SubscriptionMembersRenewResult.Records).
type MemberRecord struct {
	Member string
	// Instance is the broker instance that renews it (SubscriptionMembersRenewParams). Member
	// IDs are unique per instance only: each instance's member of one ID has its own record.
	Instance string
	// Filter is its filter text, "" for none.
	Filter string
}

// SubscriptionMembersRenewParams are the parameters of Engine.SubscriptionMembersRenew.
type SubscriptionMembersRenewParams struct {
	// Members are the members to renew, at most MaxRenewMembers.
	Members []MemberRef
	// Subscriptions are more subscriptions whose live members the result lists (with no member
	// to renew), at most MaxRenewMembers.
	Subscriptions []int64
	// TTL is how long the renewed records live, MinMemberTTL to MaxMemberTTL.
	TTL time.Duration
	// Instance names the renewing broker instance, recorded with Members (at most
	// MaxGroupNameLen bytes; "" for none).
	Instance string
	// Forget are records of members that left Instance, removed at once (only Instance's
	// records), at most MaxRenewMembers.
	Forget []MemberRef
}

// Check validates the parameters of SubscriptionMembersRenew.
func (p *SubscriptionMembersRenewParams) Check() error {
	if p == nil {
		return nilParams()
	}
	if len(p.Members) > MaxRenewMembers || len(p.Subscriptions) > MaxRenewMembers || len(p.Forget) > MaxRenewMembers {
		return Invalid("renewal of %d members, %d subscriptions and %d forgotten members, at most %d of each per call",
			len(p.Members), len(p.Subscriptions), len(p.Forget), MaxRenewMembers)
	}
	if len(p.Instance) > MaxGroupNameLen {
		return Invalid("instance name must have at most %d bytes, got %d", MaxGroupNameLen, len(p.Instance))
	}
	if p.TTL < MinMemberTTL || p.TTL > MaxMemberTTL {
		return Invalid("member TTL must be between %s and %s, got %s", MinMemberTTL, MaxMemberTTL, p.TTL)
	}
	for _, m := range p.Members {
		if m.Member == "" || len(m.Member) > MaxGroupNameLen {
			return Invalid("member name must have 1 to %d bytes, got %d", MaxGroupNameLen, len(m.Member))
		}
		if len(m.Filter) > MaxMemberFilterLen {
			return Invalid("member filter must have at most %d bytes, got %d", MaxMemberFilterLen, len(m.Filter))
		}
	}
	return nil
}

// SubscriptionIDs returns the subscriptions p names (Members and Subscriptions), sorted, once
// each.
func (p *SubscriptionMembersRenewParams) SubscriptionIDs() []int64 {
	ids := slices.Clone(p.Subscriptions)
	for _, m := range p.Members {
		ids = append(ids, m.SubscriptionID)
	}
	for _, m := range p.Forget {
		ids = append(ids, m.SubscriptionID)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// SubscriptionMembersRenewResult is the result of Engine.SubscriptionMembersRenew.
type SubscriptionMembersRenewResult struct {
	// Live maps each subscription named (ORDERED or shared) to its members whose liveness has
	// not expired, sorted (an empty list when none).
	Live map[int64][]string
	// Records maps the same subscriptions to those members' records, sorted by member.
	Records map[int64][]MemberRecord
}
