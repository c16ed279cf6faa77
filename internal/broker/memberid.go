package broker

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// Member ids and principals. A client may choose its member id (SubscribeParams.MemberID), and
// the id names the member everywhere a member is named: the broker's live members, an ordered
// group's assignment (which partitions a member owns, fenced by the generation), the liveness
// and filter records other broker instances read (Engine.SubscriptionMembersRenew, pgstore's
// sub_members table), the leases. One namespace for all clients would let one principal take
// the id another one chose: own its ordered partitions (both members named x claim what the
// assignment gives x), replace or forget its records, or simply get there first so the other's
// Subscribe is refused.
//
// So the id the engines and the broker's listings know is the member key, a function of the
// principal and the id the client chose (memberKey), and a client still sees the id it chose
// (Member.ClientID). Members of two principals never share a key, whatever ids they choose and
// whatever instance they are on, so nothing is checked at Subscribe and nothing is stored about
// the principal: no migration, no race between instances, and the members of a broker without
// authentication keep their ids as they were. The ids are only names; what a principal may
// consume is still checked by the server (SubscribeParams.Allow).

// memberKey returns the key of the member that principal names id ("" without authentication:
// the id itself). The key is "id@principal" when the principal's name is a valid group name
// (names.ValidateGroup: [A-Za-z0-9_.-]) and the whole fits in storage.MaxGroupNameLen bytes, so
// operators read it in listings and logs; else "~" and 40 hex digits of a SHA-256 over both. The
// forms never meet: an id the broker accepts (chosen, generated, or one without a principal) has
// no '@' and no '~', a readable key splits at its only '@' into its id and its principal, and a
// hashed one starts with '~'. No key holds ':', which starts the broker's give-back tags
// (giveBackPrefix).
func memberKey(principal, id string) string {
	if principal == "" {
		return id
	}
	if names.ValidateGroup(principal) == nil && len(id)+1+len(principal) <= storage.MaxGroupNameLen {
		return id + "@" + principal
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(principal)))]) // length-prefixed: unambiguous
	h.Write([]byte(principal))
	h.Write([]byte(id))
	return "~" + hex.EncodeToString(h.Sum(nil))[:40]
}
