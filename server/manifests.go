package server

import (
	"context"

	"github.com/skiff-dev/skiff/manifests"
)

// runManifests is a leader service: it applies the auto-applied manifests folder (server.manifests_dir), as
// the admin, until leadership is lost. Every server has the folder; only the leader reads it, and a new
// leader finds what the files applied in their records in the cluster (package manifests).
func (s *Server) runManifests(ctx context.Context) {
	if s.cfg.ManifestsDir == "" {
		return
	}
	cfg, err := s.adminRESTConfig(ctx)
	if err != nil {
		return
	}
	cfg.UserAgent = manifests.FieldManager + "/" + s.cfg.Name
	err = manifests.Run(ctx, manifests.Config{Dir: s.cfg.ManifestsDir, REST: cfg, Logger: s.logger.Named("manifests")})
	if err != nil && ctx.Err() == nil {
		s.logger.Error("the manifests folder is not applied", "dir", s.cfg.ManifestsDir, "error", err)
	}
}
