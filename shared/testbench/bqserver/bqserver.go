package bqserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	bq "google.golang.org/api/bigquery/v2"
)

// Query is one query as the server received it.
type Query struct {
	Project  string
	Location string
	SQL      string
	// Params are the named query parameters by name.
	Params map[string]Param
}

// Param is a named query parameter.
type Param struct {
	// Type is the parameter's type: STRING, TIMESTAMP, ARRAY, …
	Type string
	// ArrayType is the element type of an ARRAY parameter.
	ArrayType string
	// Value is a scalar parameter's value.
	Value string
	// Values are an ARRAY parameter's values.
	Values []string
}

// Result is a query's answer: column names and rows of string values (nil
// for NULL). Every column is a nullable STRING.
type Result struct {
	Columns []string
	Rows    [][]*string
}

// Error is an error answer: an HTTP status and a BigQuery error reason
// (backendError, invalidQuery, notFound, …).
type Error struct {
	Status  int
	Reason  string
	Message string
}

// Error implements error.
func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Reason, e.Message) }

// Handler answers queries.
type Handler func(ctx context.Context, q Query) (Result, error)

// Server is an http.Handler speaking the BigQuery REST calls that
// cloud.google.com/go/bigquery makes to run a query and read its rows:
// jobs.query (POST /projects/{p}/queries) and getQueryResults (GET
// /projects/{p}/queries/{job}), paginated. Point a client at it with
// option.WithEndpoint and option.WithoutAuthentication.
type Server struct {
	handler Handler
	// PageSize is the most rows one answer carries (0: all); smaller pages
	// make the client follow page tokens.
	PageSize int

	mu      sync.Mutex
	jobs    map[string]Result
	counter atomic.Int64
	queries atomic.Int64
}

// New returns a server answering with h.
func New(h Handler) *Server {
	return &Server{handler: h, jobs: map[string]Result{}}
}

// Queries is how many queries (jobs.query calls) the server answered.
func (s *Server) Queries() int64 { return s.queries.Load() }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/bigquery/v2")
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "projects" && parts[2] == "queries":
		s.query(w, r, parts[1])
	case r.Method == http.MethodGet && len(parts) == 4 && parts[0] == "projects" && parts[2] == "queries":
		s.results(w, r, parts[1], parts[3])
	default:
		writeError(w, &Error{Status: http.StatusNotFound, Reason: "notFound", Message: r.Method + " " + r.URL.Path + " is not served here"})
	}
}

func (s *Server) query(w http.ResponseWriter, r *http.Request, project string) {
	var req bq.QueryRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, &Error{Status: http.StatusBadRequest, Reason: "invalid", Message: err.Error()})
		return
	}
	q := Query{Project: project, Location: req.Location, SQL: req.Query, Params: map[string]Param{}}
	for _, p := range req.QueryParameters {
		if p.ParameterType == nil || p.ParameterValue == nil {
			writeError(w, &Error{Status: http.StatusBadRequest, Reason: "invalidQuery", Message: "parameter " + p.Name + " has no type or value"})
			return
		}
		param := Param{Type: p.ParameterType.Type, Value: p.ParameterValue.Value}
		if p.ParameterType.ArrayType != nil {
			param.ArrayType = p.ParameterType.ArrayType.Type
		}
		for _, v := range p.ParameterValue.ArrayValues {
			param.Values = append(param.Values, v.Value)
		}
		q.Params[p.Name] = param
	}
	s.queries.Add(1)
	res, err := s.handler(r.Context(), q)
	if err != nil {
		writeError(w, err)
		return
	}
	job := "job_" + strconv.FormatInt(s.counter.Add(1), 10)
	s.mu.Lock()
	s.jobs[job] = res
	s.mu.Unlock()
	page, token := s.page(res, 0, 0)
	resp := &bq.QueryResponse{
		Kind:         "bigquery#queryResponse",
		JobReference: &bq.JobReference{ProjectId: project, JobId: job, Location: req.Location},
		JobComplete:  true,
		Schema:       schema(res),
		TotalRows:    uint64(len(res.Rows)),
		PageToken:    token,
		Rows:         page,
	}
	writeJSON(w, resp)
}

func (s *Server) results(w http.ResponseWriter, r *http.Request, project, job string) {
	s.mu.Lock()
	res, ok := s.jobs[job]
	s.mu.Unlock()
	if !ok {
		writeError(w, &Error{Status: http.StatusNotFound, Reason: "notFound", Message: "no job " + job})
		return
	}
	start := 0
	if t := r.URL.Query().Get("pageToken"); t != "" {
		start, _ = strconv.Atoi(t)
	} else if si := r.URL.Query().Get("startIndex"); si != "" {
		start, _ = strconv.Atoi(si)
	}
	max, _ := strconv.Atoi(r.URL.Query().Get("maxResults"))
	page, token := s.page(res, start, max)
	writeJSON(w, &bq.GetQueryResultsResponse{
		Kind:         "bigquery#getQueryResultsResponse",
		JobReference: &bq.JobReference{ProjectId: project, JobId: job},
		JobComplete:  true,
		Schema:       schema(res),
		TotalRows:    uint64(len(res.Rows)),
		PageToken:    token,
		Rows:         page,
	})
}

func (s *Server) page(res Result, start, max int) ([]*bq.TableRow, string) {
	size := len(res.Rows) - start
	if s.PageSize > 0 && size > s.PageSize {
		size = s.PageSize
	}
	if max > 0 && size > max {
		size = max
	}
	if size <= 0 {
		return nil, ""
	}
	rows := make([]*bq.TableRow, 0, size)
	for _, row := range res.Rows[start : start+size] {
		cells := make([]*bq.TableCell, len(row))
		for i, v := range row {
			if v == nil {
				cells[i] = &bq.TableCell{}
			} else {
				cells[i] = &bq.TableCell{V: *v}
			}
		}
		rows = append(rows, &bq.TableRow{F: cells})
	}
	token := ""
	if start+size < len(res.Rows) {
		token = strconv.Itoa(start + size)
	}
	return rows, token
}

func schema(res Result) *bq.TableSchema {
	fields := make([]*bq.TableFieldSchema, len(res.Columns))
	for i, c := range res.Columns {
		fields[i] = &bq.TableFieldSchema{Name: c, Type: "STRING", Mode: "NULLABLE"}
	}
	return &bq.TableSchema{Fields: fields}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Reason: "backendError", Message: err.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": e.Status, "message": e.Message,
		"errors": []map[string]string{{"reason": e.Reason, "message": e.Message}},
	}})
}

// Strings returns a Result column of string values.
func Strings(column string, values []string) Result {
	res := Result{Columns: []string{column}}
	for i := range values {
		res.Rows = append(res.Rows, []*string{&values[i]})
	}
	return res
}
