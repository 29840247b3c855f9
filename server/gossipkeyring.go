package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/gossip"
)

// gossipKeyringKey holds the cluster's gossip keyring (gossip.Keyring, JSON), which every member's keyring
// follows: the servers read it from their store, the agents from the servers (GossipKeyringPath). The first
// leader stores its own keyring there; operators change it with `skiff operator gossip keyring`.
const gossipKeyringKey = "/skiff/gossip/keyring"

// storedKeyring is the cluster's gossip keyring as this server's store holds it, and its key-value (for a
// compare-and-swap); fsm.ErrNotFound before the first leader stored it.
func (s *Server) storedKeyring() (gossip.Keyring, *fsm.KeyValue, error) {
	plain, kv, err := s.openSecret(gossipKeyringKey)
	if err != nil {
		return gossip.Keyring{}, nil, err
	}
	var ring gossip.Keyring
	if err := json.Unmarshal(plain, &ring); err != nil {
		return gossip.Keyring{}, nil, fmt.Errorf("the stored gossip keyring: %w", err)
	}
	if ring, err = ring.Normalize(); err != nil {
		return gossip.Keyring{}, nil, fmt.Errorf("the stored gossip keyring: %w", err)
	}
	return ring, kv, nil
}

// storeKeyring writes the keyring if the stored one is still prev (nil: none is stored).
func (s *Server) storeKeyring(ctx context.Context, prev *fsm.KeyValue, ring gossip.Keyring) error {
	value, err := json.Marshal(ring)
	if err == nil {
		value, err = s.sealSecret(gossipKeyringKey, value)
	}
	if err != nil {
		return err
	}
	cmd := &fsm.Command{Type: fsm.CmdCreate, Key: gossipKeyringKey, Value: value}
	if prev != nil {
		cmd = &fsm.Command{Type: fsm.CmdUpdate, Key: gossipKeyringKey, Value: value, ExpectedModRevision: prev.ModRevision}
	}
	res, err := s.node.Apply(ctx, cmd)
	if err == nil {
		err = res.Err()
	}
	return err
}

// ensureGossipKeyring is a leader service: it stores the leader's own keyring (its keyring file's, its
// `encrypt` key, or the key derived from the cluster token) when the store has none, retrying until it is
// stored or leadership ends.
func (s *Server) ensureGossipKeyring(ctx context.Context) {
	for {
		_, _, err := s.storedKeyring()
		if !errors.Is(err, fsm.ErrNotFound) {
			return
		}
		ring, err := s.pool.Keyring()
		if err != nil {
			s.logger.Error("storing the gossip keyring", "error", err)
			return
		}
		err = s.storeKeyring(ctx, nil, ring)
		if err == nil || errors.Is(err, fsm.ErrAlreadyExists) || ctx.Err() != nil {
			return
		}
		s.logger.Warn("storing the gossip keyring; retrying", "error", err)
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
}

// followGossipKeyring keeps this server's gossip keyring equal to the stored one, checking every second,
// until ctx ends. The pool installs new keys before it switches the primary and removes old keys last.
func (s *Server) followGossipKeyring(ctx context.Context) {
	var lastErr string
	for sleepCtx(ctx, time.Second) {
		ring, _, err := s.storedKeyring()
		if errors.Is(err, fsm.ErrNotFound) {
			continue
		}
		if err == nil {
			_, err = s.pool.SetKeyring(ring)
		}
		msg := ""
		if err != nil {
			if msg = err.Error(); msg != lastErr {
				s.logger.Warn("applying the cluster's gossip keyring", "error", err)
			}
		}
		lastErr = msg
	}
}

// agentGossipKeyring serves the stored keyring to node agents (GossipKeyringPath), which apply it to their
// own pool. Only nodes get it: the keys let anyone into the gossip pool.
func (s *Server) agentGossipKeyring(w http.ResponseWriter, r *http.Request) {
	if u, ok := request.UserFrom(r.Context()); !ok || !slices.Contains(u.GetGroups(), user.NodesGroup) {
		writeStatus(w, http.StatusForbidden, "Forbidden", "only nodes ("+user.NodesGroup+") may read the gossip keyring")
		return
	}
	ring, _, err := s.storedKeyring()
	if errors.Is(err, fsm.ErrNotFound) {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "the gossip keyring is not stored yet")
		return
	} else if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, ring)
}

// GossipKeyring is the answer of GET /v1/operator/gossip/keyring: the cluster's keyring, and how far the
// alive members have applied it (each publishes its keyring's hash in gossip).
type GossipKeyring struct {
	Primary string          `json:"primary"`
	Keys    []string        `json:"keys"`
	Hash    string          `json:"hash"`
	Servers KeyringProgress `json:"servers"`
	Agents  KeyringProgress `json:"agents"`
}

// KeyringProgress counts the alive members of a role that have applied the keyring.
type KeyringProgress struct {
	Alive   int `json:"alive"`
	Applied int `json:"applied"`
	// Pending names some of the members that have not applied it yet (at most maxPendingListed).
	Pending []string `json:"pending,omitempty"`
}

const maxPendingListed = 10

// GossipKeyringChange is the answer of install, use and remove.
type GossipKeyringChange struct {
	Changed bool          `json:"changed"`
	Message string        `json:"message"`
	Keyring GossipKeyring `json:"keyring"`
}

// GossipKeyRequest is the body of install, use and remove.
type GossipKeyRequest struct {
	Key string `json:"key"` // base64
}

// keyringProgress describes the keyring with the alive members' progress towards it, as this server sees
// them in gossip.
func (s *Server) keyringProgress(ring gossip.Keyring) GossipKeyring {
	info := GossipKeyring{Primary: ring.Primary, Keys: ring.Keys, Hash: ring.Hash()}
	for _, m := range s.pool.Alive("") {
		p := &info.Agents
		if m.Meta.Role == gossip.RoleServer {
			p = &info.Servers
		}
		p.Alive++
		if m.Meta.KeyringHash == info.Hash {
			p.Applied++
		} else if len(p.Pending) < maxPendingListed {
			p.Pending = append(p.Pending, m.Name)
		}
	}
	return info
}

func (s *Server) listGossipKeyring(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := s.node.LinearizableRead(ctx); err != nil {
		writeError(w, err)
		return
	}
	ring, _, err := s.storedKeyring()
	if errors.Is(err, fsm.ErrNotFound) {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "the gossip keyring is not stored yet")
		return
	} else if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, s.keyringProgress(ring))
}

// keyringEdit is one operator change to the keyring: the keyring it leads to and what to tell the operator,
// or a refusal.
type keyringEdit func(ring gossip.Keyring, key string) (next gossip.Keyring, msg string, err error)

var (
	installKey keyringEdit = func(ring gossip.Keyring, key string) (gossip.Keyring, string, error) {
		if ring.Has(key) {
			return ring, "key " + key + " is already installed; nothing changed", nil
		}
		ring.Keys = append(slices.Clone(ring.Keys), key)
		return ring, "installed key " + key + ": every member adds it within about 10 s; when -list shows that all " +
			"members have applied the keyring, make it the primary key with -use", nil
	}
	useKey keyringEdit = func(ring gossip.Keyring, key string) (gossip.Keyring, string, error) {
		if !ring.Has(key) {
			return ring, "", fmt.Errorf("key %s is not installed: install it first (-install) and wait until every member has it", key)
		}
		if ring.Primary == key {
			return ring, "key " + key + " is already the primary key; nothing changed", nil
		}
		ring.Primary = key
		return ring, "key " + key + " is now the primary key: members encrypt with it as they apply the keyring; when " +
			"-list shows that all have, remove the old key with -remove", nil
	}
	removeKey keyringEdit = func(ring gossip.Keyring, key string) (gossip.Keyring, string, error) {
		if ring.Primary == key {
			return ring, "", fmt.Errorf("key %s is the primary key: make another key primary (-use) before removing it", key)
		}
		if !ring.Has(key) {
			return ring, "key " + key + " is not installed; nothing changed", nil
		}
		ring.Keys = slices.DeleteFunc(slices.Clone(ring.Keys), func(k string) bool { return k == key })
		return ring, "removed key " + key + ": members drop it as they apply the keyring, and a member that still " +
			"has only this key can no longer gossip", nil
	}
)

// changeGossipKeyring serves install, use and remove (on the leader): it edits the stored keyring with a
// compare-and-swap, retried when another change came first. The servers apply the result within a second
// and the agents within their poll interval.
func (s *Server) changeGossipKeyring(edit keyringEdit) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req GossipKeyRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<10)).Decode(&req); err != nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", `the body must be {"key": "<base64 key>"}: `+err.Error())
			return
		}
		key, err := gossip.ParseKey(req.Key)
		if err != nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
			return
		}
		canonical := gossip.EncodeKey(key)
		for attempt := 0; attempt < 5; attempt++ {
			ring, kv, err := s.storedKeyring()
			if errors.Is(err, fsm.ErrNotFound) {
				ring, err = s.pool.Keyring() // the leader service has not stored it yet
			}
			if err != nil {
				writeError(w, err)
				return
			}
			before := s.keyringProgress(ring)
			next, msg, err := edit(ring, canonical)
			if err != nil {
				writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
				return
			}
			next, err = next.Normalize()
			if err != nil {
				writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
				return
			}
			changed := next.Hash() != ring.Hash()
			if changed {
				err = s.storeKeyring(r.Context(), kv, next)
				if errors.Is(err, fsm.ErrConflict) || errors.Is(err, fsm.ErrAlreadyExists) {
					continue // changed meanwhile: edit the new keyring
				} else if err != nil {
					writeError(w, err)
					return
				}
				if lag := before.Servers.Alive + before.Agents.Alive - before.Servers.Applied - before.Agents.Applied; lag > 0 {
					msg += fmt.Sprintf(" (note: %d alive members had not applied the previous keyring yet)", lag)
				}
				s.logger.Info("gossip keyring changed by an operator", "change", msg)
			}
			writeJSON(w, GossipKeyringChange{Changed: changed, Message: msg, Keyring: s.keyringProgress(next)})
			return
		}
		writeStatus(w, http.StatusConflict, "Conflict", "the gossip keyring kept changing; retry")
	}
}
