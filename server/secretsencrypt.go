package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/storage/value"
	"sigs.k8s.io/yaml"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/gossip"
)

// `skiff operator secrets-encrypt status|rotate`: the keys of the managed EncryptionConfiguration
// (encryption.go) are rotated without a restart. The leader drives it, and every server must be up:
//
//  1. prepare: every server gets the file with the new key last: all can read it, none writes with it yet;
//  2. rotate: every server gets it with the new key first: all write with it;
//  3. rewrite: every Secret and server secret written with another key is written again, with the new one;
//  4. finish: every server gets the file with the new key only.
//
// A step starts only when every server took the previous one, so no server ever meets a value it cannot
// read. If a server fails a step, the rotation stops and says so; running it again is safe (it starts from
// the keys the leader's file holds, and drops none before every value is rewritten).

// EncryptionStatus is one server's encryption at rest.
type EncryptionStatus struct {
	Server string `json:"server"`
	// Mode is "managed" (Skiff's own file), "file" (server.encryption_config) or "off".
	Mode string `json:"mode"`
	Path string `json:"path,omitempty"`
	// Keys are the names of the file's keys, the one that writes first.
	Keys []string `json:"keys,omitempty"`
	Err  string   `json:"error,omitempty"`
}

// EncryptionReport is the cluster's: each server's status, and how the store's secrets are written.
type EncryptionReport struct {
	Servers []EncryptionStatus `json:"servers"`
	// Stored counts the Secrets and server secrets by the key that wrote them ("identity": in clear).
	Stored map[string]int `json:"stored"`
}

// RotationResult answers a rotation.
type RotationResult struct {
	Key       string   `json:"key"`
	Rewritten int      `json:"rewritten"`
	Servers   []string `json:"servers"`
}

const encryptionPath = "/v1/operator/secrets-encrypt"

// localEncryptionStatus is GET .../local: this server's status.
func (s *Server) localEncryptionStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.enc.status(s.cfg.Name))
}

func (e *encryptionAtRest) status(server string) EncryptionStatus {
	st := EncryptionStatus{Server: server, Mode: "off", Path: e.path}
	switch {
	case e.path == "":
		return st
	case e.managed:
		st.Mode = "managed"
	default:
		st.Mode = "file"
	}
	cfg, err := readEncryptionFile(e.path)
	if err != nil {
		st.Err = err.Error()
		return st
	}
	for _, res := range cfg.Resources {
		for _, p := range res.Providers {
			for _, k := range providerKeys(p) {
				if !slices.Contains(st.Keys, k.Name) {
					st.Keys = append(st.Keys, k.Name)
				}
			}
		}
	}
	return st
}

func readEncryptionFile(path string) (*apiserverv1.EncryptionConfiguration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg apiserverv1.EncryptionConfiguration
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &cfg, nil
}

func providerKeys(p apiserverv1.ProviderConfiguration) []apiserverv1.Key {
	switch {
	case p.Secretbox != nil:
		return p.Secretbox.Keys
	case p.AESGCM != nil:
		return p.AESGCM.Keys
	case p.AESCBC != nil:
		return p.AESCBC.Keys
	}
	return nil
}

// encryptionReport is GET /v1/operator/secrets-encrypt: every server's status, and the store's secrets by key.
func (s *Server) encryptionReport(w http.ResponseWriter, r *http.Request) {
	rep := EncryptionReport{Stored: map[string]int{}}
	servers, err := s.serverAPIAddrs()
	for _, sv := range servers {
		if sv.addr == "" {
			rep.Servers = append(rep.Servers, s.enc.status(s.cfg.Name))
			continue
		}
		var st EncryptionStatus
		if err := s.callServer(r.Context(), sv.addr, http.MethodGet, encryptionPath+"/local", nil, &st); err != nil {
			st = EncryptionStatus{Server: sv.id, Err: err.Error()}
		}
		rep.Servers = append(rep.Servers, st)
	}
	if err != nil {
		rep.Servers = append(rep.Servers, EncryptionStatus{Err: err.Error()})
	}
	s.eachStoredSecret(func(kv *fsm.KeyValue) bool {
		rep.Stored[writtenBy(kv.Value)]++
		return true
	})
	writeJSON(w, rep)
}

// writtenBy names the key a stored value was written with: k8s:enc:<provider>:v1:<key>:..., or identity.
func writtenBy(stored []byte) string {
	if !bytes.HasPrefix(stored, []byte("k8s:enc:")) {
		return "identity"
	}
	parts := strings.SplitN(string(stored[:min(len(stored), 256)]), ":", 6)
	if len(parts) < 6 {
		return "unknown"
	}
	return parts[4]
}

// eachStoredSecret calls f with every Secret and server secret this server's store holds, until f says stop.
func (s *Server) eachStoredSecret(f func(*fsm.KeyValue) bool) {
	for _, key := range []string{clusterCAKey, frontProxyCAKey, adminTokenKey, joinTokenKey, serviceAccountKeyKey, gossipKeyringKey} {
		if kv, _, err := s.node.Store().Get(key); err == nil && !f(kv) {
			return
		}
	}
	start := ""
	for {
		page := s.node.Store().Range("/registry/secrets/", start, 500)
		for _, kv := range page.KVs {
			if !f(kv) {
				return
			}
		}
		if !page.More || len(page.KVs) == 0 {
			return
		}
		start = page.KVs[len(page.KVs)-1].Key + "\x00"
	}
}

// putEncryptionConfig is PUT .../config: a step of a rotation, on one server.
func (s *Server) putEncryptionConfig(w http.ResponseWriter, r *http.Request) {
	if !s.enc.managed {
		writeStatus(w, http.StatusConflict, "Conflict", "this server uses the operator's encryption configuration "+s.enc.path)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = s.enc.receive(body)
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	s.logger.Info("installed a new encryption configuration", "keys", strings.Join(s.enc.status(s.cfg.Name).Keys, ","))
	writeJSON(w, s.enc.status(s.cfg.Name))
}

// rotateEncryption is POST .../rotate, on the leader.
func (s *Server) rotateEncryption(w http.ResponseWriter, r *http.Request) {
	if !s.enc.managed {
		msg := "encryption at rest is off: there is no key to rotate"
		if s.enc.path != "" {
			msg = "this cluster uses the operator's encryption configuration " + s.enc.path + ": rotate its keys as docs/security.md says"
		}
		writeStatus(w, http.StatusConflict, "Conflict", msg)
		return
	}
	s.rotateMu.Lock()
	defer s.rotateMu.Unlock()
	res, err := s.rotate(r.Context())
	if err != nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "rotation stopped: "+err.Error()+"; run it again once every server is up")
		return
	}
	writeJSON(w, res)
}

func (s *Server) rotate(ctx context.Context) (RotationResult, error) {
	servers, err := s.serverAPIAddrs()
	if err != nil {
		return RotationResult{}, err
	}
	cfg, err := readEncryptionFile(s.enc.path)
	if err != nil {
		return RotationResult{}, err
	}
	secrets := map[string]string{}
	var names []string
	if len(cfg.Resources) > 0 && len(cfg.Resources[0].Providers) > 0 {
		for _, k := range providerKeys(cfg.Resources[0].Providers[0]) {
			names = append(names, k.Name)
			secrets[k.Name] = k.Secret
		}
	}
	fresh := newKeyName()
	for i := 2; secrets[fresh] != ""; i++ {
		fresh = fmt.Sprintf("%s-%d", newKeyName(), i)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return RotationResult{}, err
	}
	secrets[fresh] = base64.StdEncoding.EncodeToString(raw)
	res := RotationResult{Key: fresh}
	for _, sv := range servers {
		res.Servers = append(res.Servers, sv.id)
	}
	push := func(step string, keys []string) error {
		body, err := managedConfig(keys, secrets)
		if err != nil {
			return err
		}
		for _, sv := range servers {
			if sv.addr == "" {
				err = s.enc.receive(body)
			} else {
				err = s.callServer(ctx, sv.addr, http.MethodPut, encryptionPath+"/config", body, nil)
			}
			if err != nil {
				return fmt.Errorf("%s: server %s: %w", step, sv.id, err)
			}
		}
		s.logger.Info("encryption key rotation", "step", step, "keys", strings.Join(keys, ","))
		return nil
	}
	if err := push("prepare", append(slices.Clone(names), fresh)); err != nil {
		return res, err
	}
	if err := push("rotate", append([]string{fresh}, names...)); err != nil {
		return res, err
	}
	if res.Rewritten, err = s.rewriteSecrets(ctx); err != nil {
		return res, fmt.Errorf("rewrite: %w", err)
	}
	return res, push("finish", []string{fresh})
}

// rewriteSecrets writes again, with the first key, every stored secret another key wrote: a compare-and-swap
// per key, retried when a writer got there first.
func (s *Server) rewriteSecrets(ctx context.Context) (int, error) {
	if err := s.node.LinearizableRead(ctx); err != nil {
		return 0, err
	}
	var keys []string
	s.eachStoredSecret(func(kv *fsm.KeyValue) bool {
		keys = append(keys, kv.Key)
		return true
	})
	t := s.enc.transformerFor(secretsResource)
	rewritten := 0
	for _, key := range keys {
		for attempt := 0; ; attempt++ {
			kv, _, err := s.node.Store().Get(key)
			if errors.Is(err, fsm.ErrNotFound) {
				break
			} else if err != nil {
				return rewritten, err
			}
			plain, stale, err := t.TransformFromStorage(ctx, kv.Value, value.DefaultContext(key))
			if err != nil {
				return rewritten, fmt.Errorf("cannot decrypt %s: %w", key, err)
			}
			if !stale {
				break
			}
			sealed, err := t.TransformToStorage(ctx, plain, value.DefaultContext(key))
			if err != nil {
				return rewritten, err
			}
			out, err := s.node.Apply(ctx, &fsm.Command{Type: fsm.CmdUpdate, Key: key, Value: sealed, ExpectedModRevision: kv.ModRevision, ExpiresAt: kv.ExpiresAt})
			if err == nil {
				err = out.Err()
			}
			if err == nil {
				rewritten++
				break
			}
			if !errors.Is(err, fsm.ErrConflict) && !errors.Is(err, fsm.ErrNotFound) || attempt == 10 {
				return rewritten, fmt.Errorf("rewriting %s: %w", key, err)
			}
			// A writer changed it meanwhile: read it again (what it wrote is sealed with the new key).
			if err := s.node.LinearizableRead(ctx); err != nil {
				return rewritten, err
			}
		}
	}
	return rewritten, nil
}

type serverAddr struct {
	id   string
	addr string // "" for this server
}

// serverAPIAddrs are the API addresses of every server in the Raft configuration, from gossip; it fails
// when one is not alive there.
func (s *Server) serverAPIAddrs() ([]serverAddr, error) {
	servers, err := s.node.Servers()
	if err != nil {
		return nil, err
	}
	var out []serverAddr
	var missing []string
	for _, sv := range servers {
		if sv.ID == s.cfg.Name {
			out = append(out, serverAddr{id: sv.ID})
			continue
		}
		m, ok := s.pool.Member(sv.ID)
		if !ok || m.Status != gossip.StatusAlive || m.Meta.APIAddr == "" {
			missing = append(missing, sv.ID)
			continue
		}
		out = append(out, serverAddr{id: sv.ID, addr: m.Meta.APIAddr})
	}
	if len(missing) > 0 {
		return out, fmt.Errorf("every server must be up, and %s is not", strings.Join(missing, ", "))
	}
	return out, nil
}

// callServer calls another server's operator endpoint with this server's admin credential.
func (s *Server) callServer(ctx context.Context, addr, method, path string, body []byte, out any) error {
	token, ok := s.adminToken()
	if !ok {
		return errors.New("the admin token has not replicated here yet")
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Transport: s.peerTransport()}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var st struct{ Message string }
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			return errors.New(st.Message)
		}
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
