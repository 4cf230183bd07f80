package main

import (
	"context"
	"errors"
	"io"
)

func runLocal(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return errors.New("local: not built yet")
}
