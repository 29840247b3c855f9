package raftstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/skiff-dev/skiff/fsm"
)

// ErrClaimed means another holder has the name; ClaimedError says who.
var ErrClaimed = errors.New("already claimed")

// ClaimedError is the error of a claim on a name another holder has.
type ClaimedError struct{ Name, Holder string }

func (e *ClaimedError) Error() string {
	return fmt.Sprintf("%s is already claimed by %q", e.Name, e.Holder)
}
func (e *ClaimedError) Unwrap() error { return ErrClaimed }

// Claims are names that at most one holder may have at a time, across every peer and leader change: the
// NodePorts of Services and the pod CIDRs of Nodes. A claim is a key created in the store (the create fails
// when the key is live) whose value is the holder; releasing deletes the key only at the mod revision it had
// when its holder was checked, so a release never frees a name that someone claimed again in between.
type Claims struct {
	backend Backend
	prefix  string // ends with "/"
}

// NewClaims returns the claims kept under prefix.
func NewClaims(b Backend, prefix string) *Claims {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Claims{backend: b, prefix: prefix}
}

// Claim gives name to holder; created says whether this call took it (false: the holder had it already, say
// an agent registering its Node again, and a failed create must not release it). It fails with a
// *ClaimedError when someone else holds the name. Raft errors are mapped like any write's (503 with
// Retry-After without a leader).
func (c *Claims) Claim(ctx context.Context, name, holder string) (created bool, err error) {
	res, err := c.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: c.prefix + name, Value: []byte(holder)})
	if err != nil {
		return false, MapBackendError(err)
	}
	if !errors.Is(res.Err(), fsm.ErrAlreadyExists) {
		return res.Err() == nil, res.Err()
	}
	// Taken: by this holder (a retried claim, an agent registering again) or by another. The create went
	// through the leader, so this peer's store is read after it has applied that revision.
	if err := c.waitApplied(ctx, res.Revision); err != nil {
		return false, err
	}
	if kv, _, err := c.backend.Store().Get(c.prefix + name); err == nil {
		if string(kv.Value) == holder {
			return false, nil
		}
		return false, &ClaimedError{Name: name, Holder: string(kv.Value)}
	}
	// Released between the create and the read: try again.
	return c.Claim(ctx, name, holder)
}

// Release frees name if holder still has it. It is idempotent.
func (c *Claims) Release(ctx context.Context, name, holder string) error {
	if err := MapBackendError(c.backend.LinearizableRead(ctx)); err != nil {
		return err
	}
	kv, _, err := c.backend.Store().Get(c.prefix + name)
	if errors.Is(err, fsm.ErrNotFound) || (err == nil && string(kv.Value) != holder) {
		return nil
	} else if err != nil {
		return err
	}
	res, err := c.backend.Apply(ctx, &fsm.Command{Type: fsm.CmdDelete, Key: c.prefix + name, ExpectedModRevision: kv.ModRevision})
	if err != nil {
		return MapBackendError(err)
	}
	if errors.Is(res.Err(), fsm.ErrConflict) || errors.Is(res.Err(), fsm.ErrNotFound) {
		return nil // released, or released and claimed again, meanwhile: no longer this holder's to free
	}
	return res.Err()
}

// Holders returns every claimed name with its holder, as this peer's store has them (not a linearizable
// read: callers use it to skip names that are surely taken, and Claim decides).
func (c *Claims) Holders() map[string]string {
	out := map[string]string{}
	for _, kv := range c.backend.Store().Range(c.prefix, "", 0).KVs {
		out[kv.Key[len(c.prefix):]] = string(kv.Value)
	}
	return out
}

// waitApplied waits until this peer's store has applied rev.
func (c *Claims) waitApplied(ctx context.Context, rev int64) error {
	if c.backend.Store().Revision() >= rev {
		return nil
	}
	return MapBackendError(c.backend.LinearizableRead(ctx))
}
