// Original file: ../../proto/streambp/v1/trainer.proto


export interface ListSessionsRequest {
}

export interface ListSessionsRequest__Output {
}
