package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/join"
)

// JoinTokenRotation is the body of POST /v1/operator/join-token/rotate (Token optional: a new secret is
// drawn when empty) and of its answer (Token in K10 form, for agents).
type JoinTokenRotation struct {
	Token string `json:"token,omitempty"`
}

// rotateJoinToken replaces the node agents' join token, which revokes the old one: an agent that presents
// it gets 401 and no certificate. Agents that have their certificate keep it and renew it with it. The
// servers' own cluster token (server.token) does not change; it is in their HCL.
func (s *Server) rotateJoinToken(w http.ResponseWriter, r *http.Request) {
	var req JoinTokenRotation
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "the body is not a join token rotation: "+err.Error())
		return
	}
	var secret string
	if req.Token != "" {
		tok, err := join.ParseToken(req.Token)
		if err != nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", "token: "+err.Error())
			return
		}
		secret = tok.Secret
	} else {
		drawn, err := newToken()
		if err != nil {
			writeError(w, err)
			return
		}
		secret = string(drawn)
	}
	caPEM, _, _, err := s.clusterCA()
	if err != nil {
		writeError(w, err)
		return
	}
	sealed, err := s.sealSecret(joinTokenKey, []byte(secret))
	if err != nil {
		writeError(w, err)
		return
	}
	cmd := &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: joinTokenKey, Value: sealed}}}}
	res, err := s.node.Apply(r.Context(), cmd)
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		writeError(w, err)
		return
	}
	s.logger.Info("the join token was rotated: agents presenting the old one are refused")
	writeJSON(w, JoinTokenRotation{Token: join.Token{Secret: secret}.WithCA(caPEM).String()})
}
